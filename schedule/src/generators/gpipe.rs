//! GPipe: every forward, then every backward.
//!
//! Bubble `(p-1)/(m+p-1)` of the step with uniform costs; device `r` holds all `m`
//! microbatches' activations at the turn, which is what 1F1B fixes.

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// GPipe timetable: device `r` runs `F(r, 0..m)` then `B(r, 0..m)`.
pub fn gpipe(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let m = spec.microbatches();
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        actions.reserve(2 * m as usize);
        actions.extend((0..m).map(|mb| Action::new(r, ActionKind::F, mb)));
        actions.extend((0..m).map(|mb| Action::new(r, ActionKind::B, mb)));
    }
    tt
}
