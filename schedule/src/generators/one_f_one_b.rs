//! 1F1B (PipeDream-flush): warm up with forwards, then alternate one forward and one backward.
//!
//! Device `r` runs `w = min(p-r-1, m)` warm-up forwards, then `m-w` pairs of (forward,
//! backward), then `w` cool-down backwards. Same bubble as GPipe, `(p-1)/(m+p-1)`, but at
//! most `min(p-r, m)` microbatches in flight instead of `m`.

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// 1F1B timetable.
pub fn one_f_one_b(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, m) = (spec.devices(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        let warmup = (p - r - 1).min(m);
        let f = |mb| Action::new(r, ActionKind::F, mb);
        let b = |mb| Action::new(r, ActionKind::B, mb);
        actions.reserve(2 * m as usize);
        actions.extend((0..warmup).map(f));
        for i in 0..m - warmup {
            actions.push(f(warmup + i));
            actions.push(b(i));
        }
        actions.extend((m - warmup..m).map(b));
    }
    tt
}
