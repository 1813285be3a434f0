//! Recomputation written into a timetable: an `R` right before each backward of a stage that
//! recomputes, so that the simulator charges it and the runtime runs it where it stands.

use std::collections::{BTreeSet, HashSet};

use super::{Recompute, RecomputePlan};
use crate::action::{Action, ActionKind};
use crate::stash::{Change, Form};
use crate::timetable::Timetable;

/// `tt` with an `R` placed right before the first backward (B or I, an F&B overlap's B
/// included) of every microbatch of every stage that `plan` recomputes. Microbatches that
/// already have an `R` keep theirs, so a hand-placed recompute (in a bubble, say) stays put.
/// Works on compute-only and lowered timetables alike: an `R` needs no communication.
pub fn insert(tt: &Timetable, plan: &RecomputePlan) -> Timetable {
    let mut have: HashSet<(u32, u32)> = tt
        .devices
        .iter()
        .flatten()
        .filter(|a| a.kind == ActionKind::R)
        .map(|a| (a.stage, a.microbatch))
        .collect();
    let devices = tt
        .devices
        .iter()
        .map(|row| {
            let mut out = Vec::with_capacity(row.len() * 2);
            for &a in row {
                for p in a.parts().filter(|p| p.kind.is_input_backward()) {
                    let recomputes = plan.of(p.stage) != Recompute::None;
                    if recomputes && have.insert((p.stage, p.microbatch)) {
                        out.push(Action::new(p.stage, ActionKind::R, p.microbatch));
                    }
                }
                out.push(a);
            }
            out
        })
        .collect();
    Timetable {
        devices,
        ..tt.clone()
    }
}

/// The microbatches of one device's `row` that keep their whole stash although their stage
/// recomputes: on a stage with `R`s in the row, the forwards without one (a timetable
/// recomputes only what it names). The runtime keeps them whole, and the memory walk counts
/// them so: they are the forwards the [stash walk](crate::stash) stashes in
/// [`Form::Whole`](crate::stash::Form::Whole). A stage with no `R` in the row recomputes by
/// its policy alone.
pub fn kept_whole(row: &[Action]) -> HashSet<(u32, u32)> {
    let mut whole = HashSet::new();
    crate::stash::walk(row, |_, part, change| {
        if change == Change::Stash(Form::Whole) {
            whole.insert((part.stage, part.microbatch));
        }
    });
    whole
}

/// The stages with at least one `R` action in `tt`.
pub fn recomputed(tt: &Timetable) -> BTreeSet<u32> {
    tt.devices
        .iter()
        .flatten()
        .filter(|a| a.kind == ActionKind::R)
        .map(|a| a.stage)
        .collect()
}
