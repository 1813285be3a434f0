//! Looped BFS (breadth-first): `v` chunks per device, placement "loop", and every device runs
//! all microbatches of its earlier chunk before any of its next one.
//!
//! Device `r` runs `F(c*p + r, 0..m)` for `c = 0..v`, then the backwards `B(c*p + r, 0..m)`
//! for `c = v-1 down to 0`. With `m >= p`, the first microbatch is back at device 0 for chunk
//! `c+1` (after `p` forwards) before the device has finished chunk `c`'s `m` forwards, so the
//! pipeline fills once: bubble `(p-1)/(vm+p-1)` with uniform costs, as interleaving, but every
//! device stashes all `v*m` stage-microbatches at the turn, as GPipe.

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// Looped BFS timetable. With `v = 1` it is exactly GPipe.
pub fn looped_bfs(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, v, m) = (spec.devices(), spec.virtual_stages(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        actions.reserve(2 * (v * m) as usize);
        for chunk in 0..v {
            actions.extend((0..m).map(|mb| Action::new(chunk * p + r, ActionKind::F, mb)));
        }
        for chunk in (0..v).rev() {
            actions.extend((0..m).map(|mb| Action::new(chunk * p + r, ActionKind::B, mb)));
        }
    }
    tt
}
