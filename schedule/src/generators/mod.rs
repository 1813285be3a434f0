//! Schedule generators: each a pure function from a validated spec to a compute-only timetable.
//!
//! A generator decides only the order of F and B per device. Sends and receives come from
//! [`lower`](crate::lower); timing comes from [`simulate`](crate::simulate).

mod dualpipev;
mod gpipe;
mod interleaved;
mod looped_bfs;
mod one_f_one_b;
mod zb_h1;
mod zb_h2;
mod zbv;
mod zero_bubble;

pub use dualpipev::dualpipev;
pub use gpipe::gpipe;
pub use interleaved::interleaved_1f1b;
pub use looped_bfs::looped_bfs;
pub use one_f_one_b::one_f_one_b;
pub use zb_h1::zb_h1;
pub use zb_h2::zb_h2;
pub use zbv::zbv;

use crate::spec::{ScheduleKind, ScheduleSpec};
use crate::timetable::Timetable;

/// Generate the compute-only timetable of a validated spec.
pub fn generate(spec: &ScheduleSpec) -> Timetable {
    match spec.kind() {
        ScheduleKind::GPipe => gpipe(spec),
        ScheduleKind::OneFOneB => one_f_one_b(spec),
        ScheduleKind::Interleaved1F1B => interleaved_1f1b(spec),
        ScheduleKind::LoopedBfs => looped_bfs(spec),
        ScheduleKind::ZbH1 => zb_h1(spec),
        ScheduleKind::ZbH2 => zb_h2(spec),
        ScheduleKind::Zbv => zbv(spec),
        ScheduleKind::DualPipeV => dualpipev(spec),
    }
}

/// An empty timetable shaped by `spec`.
fn empty(spec: &ScheduleSpec) -> Timetable {
    Timetable::empty(
        spec.kind().name(),
        spec.devices(),
        spec.stages(),
        spec.microbatches(),
        spec.placement(),
    )
}
