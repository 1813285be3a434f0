//! The one walk of a device's actions that finds its activation peak, shared by the memory
//! model (in bytes) and the schedule search (in units of a microbatch's activations).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind};
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
/// action at a time, so this is the timed peak too). See [`device_levels`].
pub fn peak_walk(tt: &Timetable, stages: &[StageBytes]) -> Vec<f64> {
    tt.devices
        .iter()
        .map(|row| device_levels(row, stages).into_iter().fold(0.0, f64::max))
        .collect()
}

/// The most one device holds during each part of its actions (an F&B overlap is two parts:
/// its F, then its B), counted the way the runtime counts. On a stage with `R` actions in the
/// row, a microbatch with an `R` keeps the stage's `kept` from its F and the R grows it to
/// `full`, while one without keeps `full` (the runtime recomputes exactly what the timetable
/// names). On a stage without, every F keeps `kept`, and a backward of a slim stash grows it
/// first (the runtime rebuilds it there). B frees `full`; I frees `full` and adds `weight`;
/// W frees `weight`. Stages past `stages` hold nothing.
pub fn device_levels(row: &[Action], stages: &[StageBytes]) -> Vec<f64> {
    let none = StageBytes::default();
    let parts = || row.iter().flat_map(|a| a.parts());
    let named: HashSet<(u32, u32)> = parts()
        .filter(|p| p.kind == ActionKind::R)
        .map(|p| (p.stage, p.microbatch))
        .collect();
    let named_stages: HashSet<u32> = named.iter().map(|&(s, _)| s).collect();
    let mut slim = HashSet::new();
    let mut now = 0.0f64;
    parts()
        .map(|part| {
            let c = stages.get(part.stage as usize).unwrap_or(&none);
            let key = (part.stage, part.microbatch);
            let mut high = now;
            let mut grow = |now: &mut f64, by: f64| {
                *now += by;
                high = high.max(*now);
            };
            match part.kind {
                ActionKind::F => {
                    let whole = named_stages.contains(&part.stage) && !named.contains(&key);
                    if whole || c.kept >= c.full {
                        grow(&mut now, c.full);
                    } else {
                        slim.insert(key);
                        grow(&mut now, c.kept);
                    }
                }
                ActionKind::R => {
                    if slim.remove(&key) {
                        grow(&mut now, c.full - c.kept);
                    }
                }
                ActionKind::B | ActionKind::I => {
                    if slim.remove(&key) {
                        grow(&mut now, c.full - c.kept);
                    }
                    now -= c.full;
                    if part.kind == ActionKind::I {
                        grow(&mut now, c.weight);
                    }
                }
                ActionKind::W => now -= c.weight,
                _ => {}
            }
            high
        })
        .collect()
}
