//! The schedule's [stash walk](pipewright_schedule::stash) weighed per stage in
//! [`StageBytes`]: a device's activation peak for the memory model (in bytes) and the schedule
//! search (in units of a microbatch's activations). The walk says what is stashed, rebuilt
//! and freed; this says how much.

use serde::{Deserialize, Serialize};

use pipewright_schedule::action::Action;
use pipewright_schedule::stash::{Change, Form, StashWalk};
use pipewright_schedule::timetable::Timetable;

/// What one microbatch of one stage holds, in any unit (bytes, or the search's units).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageBytes {
    /// Held from the forward until the stash is rebuilt (an `R`, or the backward itself when
    /// no `R` came first): the stage's recompute policy's slim stash; `full` without one.
    pub kept: f64,
    /// The whole stash the backward (B or I) consumes.
    pub full: f64,
    /// Held from I until W (a split backward's weight stash).
    pub weight: f64,
    /// The stash with no recomputation at all, held from F to the backward by a microbatch
    /// its stage does not recompute while other microbatches of the stage do (`R`s name
    /// some). Equal to `full` where a rebuilt stash is the whole one (pipewright's runtime);
    /// larger under Megatron's layer-by-layer rebuild, whose `full` is the kept stash plus
    /// one layer.
    pub whole: f64,
}

impl StageBytes {
    /// A stage that keeps everything and whose W holds `weight`.
    pub fn plain(full: f64, weight: f64) -> Self {
        StageBytes {
            kept: full,
            full,
            weight,
            whole: full,
        }
    }
}

/// Most held at once by each device when it runs its actions in order (a device runs one
/// action at a time, so this is the timed peak too). See [`device_levels`].
pub fn peak_walk(tt: &Timetable, stages: &[StageBytes]) -> Vec<f64> {
    tt.devices
        .iter()
        .map(|row| device_levels(row, stages).into_iter().fold(0.0, f64::max))
        .collect()
}

/// The most one device holds during each part of its actions (an F&B overlap is two parts:
/// its F, then its B), counted the way the runtime counts (the
/// [stash walk](pipewright_schedule::stash)). Stages past `stages` hold nothing.
pub fn device_levels(row: &[Action], stages: &[StageBytes]) -> Vec<f64> {
    let mut held = Stashes::new(row);
    row.iter()
        .flat_map(|a| a.parts())
        .map(|part| {
            let mut high = held.now;
            held.apply(part, stages, |level| high = high.max(level));
            high
        })
        .collect()
}

/// One device's stashed activations as its compute parts run, in the runtime's order: the
/// schedule's [stash walk](pipewright_schedule::stash) weighed in a stage's [`StageBytes`].
/// A slim stash (an F of a stage with `R`s whose microbatch has one, or of a stage without
/// `R`s, under its policy) holds `kept` and grows to `full` when rebuilt; a whole one (a
/// microbatch without `R` on a stage with some) holds `whole`. B frees `full` (or `whole`);
/// I frees it and adds `weight`; W frees `weight`.
pub(super) struct Stashes {
    walk: StashWalk,
    /// Held now.
    pub(super) now: f64,
}

impl Stashes {
    /// Nothing held yet, for the actions of `row`.
    pub(super) fn new(row: &[Action]) -> Self {
        Stashes {
            walk: StashWalk::new(row),
            now: 0.0,
        }
    }

    /// Runs one compute part, calling `grew` with the level after each growth (the moments
    /// the runtime compares with its peak). Other kinds hold nothing.
    pub(super) fn apply(&mut self, part: Action, stages: &[StageBytes], mut grew: impl FnMut(f64)) {
        let none = StageBytes::default();
        let c = stages.get(part.stage as usize).unwrap_or(&none);
        // A policy that keeps everything (or more) stashes the whole and rebuilds nothing.
        let kept = if c.kept >= c.full { c.full } else { c.kept };
        let freed = |form| if form == Form::Whole { c.whole } else { c.full };
        let now = &mut self.now;
        let mut grow = |now: &mut f64, by: f64| {
            *now += by;
            grew(*now);
        };
        self.walk.step(part, |change| match change {
            Change::Stash(Form::Whole) => grow(now, c.whole),
            Change::Stash(_) => grow(now, kept),
            Change::Rebuild(_) => grow(now, c.full - kept),
            Change::Free(form) => *now -= freed(form),
            Change::Split(form) => {
                *now -= freed(form);
                grow(now, c.weight);
            }
            Change::FreeWeight => *now -= c.weight,
        });
    }
}
