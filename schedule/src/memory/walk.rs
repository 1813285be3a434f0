//! The one walk of a device's actions that finds its activation peak, shared by the memory
//! model (in bytes) and the schedule search (in units of a microbatch's activations).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::action::ActionKind;
use crate::timetable::Timetable;

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
}

impl StageBytes {
    /// A stage that keeps everything and whose W holds `weight`.
    pub fn plain(full: f64, weight: f64) -> Self {
        StageBytes {
            kept: full,
            full,
            weight,
        }
    }
}

/// Most held at once by each device when it runs its actions in order (a device runs one
/// action at a time, so this is the timed peak too), counted the way the runtime counts:
/// F adds the stage's `kept`; R grows it to `full`; a B or I of a microbatch that kept a
/// slim stash and had no R grows it first; B frees `full`; I frees `full` and adds `weight`;
/// W frees `weight`. An F&B overlap is its F, then its B. Stages past `stages` hold nothing.
pub fn peak_walk(tt: &Timetable, stages: &[StageBytes]) -> Vec<f64> {
    let none = StageBytes::default();
    tt.devices
        .iter()
        .map(|actions| {
            let (mut now, mut peak) = (0.0f64, 0.0f64);
            let mut rebuilt = HashSet::new();
            let grow = |now: &mut f64, peak: &mut f64, by: f64| {
                *now += by;
                *peak = peak.max(*now);
            };
            for part in actions.iter().flat_map(|a| a.parts()) {
                let c = stages.get(part.stage as usize).unwrap_or(&none);
                let key = (part.stage, part.microbatch);
                match part.kind {
                    ActionKind::F => grow(&mut now, &mut peak, c.kept),
                    ActionKind::R => {
                        rebuilt.insert(key);
                        grow(&mut now, &mut peak, c.full - c.kept);
                    }
                    ActionKind::B | ActionKind::I => {
                        if !rebuilt.remove(&key) && c.kept != c.full {
                            grow(&mut now, &mut peak, c.full - c.kept);
                        }
                        now -= c.full;
                        if part.kind == ActionKind::I {
                            grow(&mut now, &mut peak, c.weight);
                        }
                    }
                    ActionKind::W => now -= c.weight,
                    _ => {}
                }
            }
            peak
        })
        .collect()
}
