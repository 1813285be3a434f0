//! The stash walk: which microbatch-stages a device holds activations for, in what form, as
//! it runs its actions in order. It is the one walk behind every count of stashed memory:
//! the simulator's report (bytes over time), the memory model (bytes beside its buffers) and
//! the schedule search (units of a microbatch's share). It says what is stashed, rebuilt and
//! freed, never how much: each caller weighs a [`Change`] in its own unit.
//!
//! The rules, the runtime's:
//! - `F` stashes its microbatch-stage. On a stage with `R`s in the row, a microbatch with an
//!   `R` of its own stashes [`Form::Named`] (slim until that `R` rebuilds it), and one without
//!   keeps its [`Form::Whole`] stash: a timetable recomputes only what it names. On a stage
//!   with no `R` in the row every `F` stashes by the stage's [`Form::Policy`].
//! - An `R` rebuilds its stash if it is still slim; the first backward (`B` or `I`) rebuilds
//!   a slim stash that no `R` rebuilt first.
//! - `B` frees the stash. `I` frees it and holds what `W` still needs; the microbatch-stage
//!   stays in flight until its `W` frees that.
//!
//! An F&B overlap is its `F`, then its `B`.
//!
//! ```
//! use pipewright_schedule::stash::peak_in_flight;
//! use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
//!
//! // 1F1B: device d holds at most p - d microbatches in flight.
//! let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None)?);
//! let peaks: Vec<u32> = tt.devices.iter().map(|row| peak_in_flight(row)).collect();
//! assert_eq!(peaks, [4, 3, 2, 1]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, HashSet};

use crate::action::{Action, ActionKind};

/// How a forward keeps its microbatch-stage's stash until the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// Everything, never recomputed: its stage has `R`s in the row, but none for this
    /// microbatch.
    Whole,
    /// What the stage's recompute keeps; this microbatch's own `R` rebuilds the rest.
    Named,
    /// What the stage's recompute policy keeps (a stage with no `R` in the row); the
    /// backward rebuilds the rest. A caller without policies (simulator, search) weighs it
    /// as the whole stash, with nothing to rebuild.
    Policy,
}

/// One change to a device's stashes, caused by one part of an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// An `F` stashes its microbatch-stage in this form.
    Stash(Form),
    /// A slim stash (never [`Form::Whole`]) grows back to the whole: at its `R`, or at its
    /// backward when no `R` came first. Comes before that backward's [`Change::Free`] or
    /// [`Change::Split`].
    Rebuild(Form),
    /// A `B` frees the stash (kept whole, or rebuilt).
    Free(Form),
    /// An `I` frees the stash and holds what the `W` needs; still in flight.
    Split(Form),
    /// A `W` frees what its `I` held; no longer in flight.
    FreeWeight,
}

impl Change {
    /// How the number of microbatch-stages in flight moves: +1 at a stash, -1 at the end of
    /// the backward (`B`, or the `W` of a split one).
    pub fn in_flight(self) -> i32 {
        match self {
            Change::Stash(_) => 1,
            Change::Free(_) | Change::FreeWeight => -1,
            Change::Rebuild(_) | Change::Split(_) => 0,
        }
    }
}

/// A microbatch of this stage has an `R` in the row.
const NAMED: u8 = 1;
/// Stashed slim, not rebuilt yet.
const SLIM: u8 = 2;

/// The walk over one device's row: build it from the whole row, then [`step`](Self::step)
/// through the row's parts in order (callers may interleave their own accounting).
#[derive(Clone, Debug)]
pub struct StashWalk {
    keys: Keys,
}

impl StashWalk {
    /// Nothing stashed yet, for the actions of `row` (lowered or not).
    pub fn new(row: &[Action]) -> Self {
        StashWalk {
            keys: Keys::new(row),
        }
    }

    /// Runs one compute part (an `F`, `R`, `B`, `I` or `W` of `row`; see
    /// [`Action::parts`]), passing each change to `visit` in order. Other kinds change
    /// nothing.
    pub fn step(&mut self, part: Action, mut visit: impl FnMut(Change)) {
        let key = (part.stage, part.microbatch);
        match part.kind {
            ActionKind::F => {
                let form = self.keys.form(key);
                if form != Form::Whole {
                    self.keys.set(key, SLIM, true);
                }
                visit(Change::Stash(form));
            }
            // An R of a stash kept whole, rebuilt already or not stashed changes nothing.
            ActionKind::R if self.keys.set(key, SLIM, false) => {
                visit(Change::Rebuild(self.keys.form(key)))
            }
            ActionKind::B | ActionKind::I => {
                let form = self.keys.form(key);
                if self.keys.set(key, SLIM, false) {
                    visit(Change::Rebuild(form));
                }
                visit(if part.kind == ActionKind::B {
                    Change::Free(form)
                } else {
                    Change::Split(form)
                });
            }
            ActionKind::W => visit(Change::FreeWeight),
            _ => {}
        }
    }
}

/// Every change of `row`, in order, with the index in `row` of the action causing it.
pub fn walk(row: &[Action], mut visit: impl FnMut(usize, Action, Change)) {
    let mut w = StashWalk::new(row);
    for (i, a) in row.iter().enumerate() {
        for part in a.parts() {
            w.step(part, |c| visit(i, part, c));
        }
    }
}

/// Most microbatch-stages `row` holds in flight at once (from `F` to the end of its
/// backward, its `W` for a split one).
pub fn peak_in_flight(row: &[Action]) -> u32 {
    let (mut now, mut peak) = (0i64, 0i64);
    walk(row, |_, _, c| {
        now += i64::from(c.in_flight());
        peak = peak.max(now);
    });
    peak.clamp(0, i64::from(u32::MAX)) as u32
}

/// Flags per (stage, microbatch) of a row: a dense table when the row's keys are about as
/// many as its actions (every real schedule, and fast: no hashing per part), a map when a
/// row names few keys in a wide range (a hand-written or fuzzed file).
#[derive(Clone, Debug)]
enum Keys {
    Dense {
        /// The row's stages, sorted.
        stages: Vec<u32>,
        /// Per stage of `stages`: it has an `R` in the row.
        named: Vec<bool>,
        /// Microbatches per stage: the row's largest plus one.
        width: usize,
        flags: Vec<u8>,
    },
    Sparse {
        named: HashSet<u32>,
        flags: HashMap<(u32, u32), u8>,
    },
}

impl Keys {
    fn new(row: &[Action]) -> Self {
        let parts = || {
            row.iter()
                .flat_map(|a| a.parts())
                .filter(|p| p.kind.is_compute())
        };
        let mut stages: Vec<u32> = parts().map(|p| p.stage).collect();
        stages.sort_unstable();
        stages.dedup();
        let width = parts()
            .map(|p| p.microbatch as usize + 1)
            .max()
            .unwrap_or(0);
        let n = parts().count();
        let mut keys = match stages.len().checked_mul(width) {
            Some(size) if size <= 4 * n + 64 => Keys::Dense {
                named: vec![false; stages.len()],
                flags: vec![0; size],
                stages,
                width,
            },
            _ => Keys::Sparse {
                named: HashSet::new(),
                flags: HashMap::new(),
            },
        };
        for p in parts().filter(|p| p.kind == ActionKind::R) {
            keys.set((p.stage, p.microbatch), NAMED, true);
            match &mut keys {
                Keys::Dense { stages, named, .. } => {
                    if let Ok(i) = stages.binary_search(&p.stage) {
                        named[i] = true;
                    }
                }
                Keys::Sparse { named, .. } => {
                    named.insert(p.stage);
                }
            }
        }
        keys
    }

    /// The form an `F` of `key` stashes in.
    fn form(&self, key: (u32, u32)) -> Form {
        let stage_named = match self {
            Keys::Dense { stages, named, .. } => {
                stages.binary_search(&key.0).is_ok_and(|i| named[i])
            }
            Keys::Sparse { named, .. } => named.contains(&key.0),
        };
        match (stage_named, self.get(key) & NAMED != 0) {
            (false, _) => Form::Policy,
            (true, true) => Form::Named,
            (true, false) => Form::Whole,
        }
    }

    fn get(&self, key: (u32, u32)) -> u8 {
        match self {
            Keys::Dense {
                stages,
                width,
                flags,
                ..
            } => match stages.binary_search(&key.0) {
                Ok(s) if (key.1 as usize) < *width => flags[s * width + key.1 as usize],
                _ => 0,
            },
            Keys::Sparse { flags, .. } => flags.get(&key).copied().unwrap_or(0),
        }
    }

    /// Sets or clears `flag` of `key`, returning whether it was set. Keys outside the row
    /// (a dense table has no slot for them) keep no flags.
    fn set(&mut self, key: (u32, u32), flag: u8, on: bool) -> bool {
        let cell = match self {
            Keys::Dense {
                stages,
                width,
                flags,
                ..
            } => match stages.binary_search(&key.0) {
                Ok(s) if (key.1 as usize) < *width => &mut flags[s * *width + key.1 as usize],
                _ => return false,
            },
            Keys::Sparse { flags, .. } => {
                if !on && !flags.contains_key(&key) {
                    return false;
                }
                flags.entry(key).or_insert(0)
            }
        };
        let was = *cell & flag != 0;
        if on {
            *cell |= flag;
        } else {
            *cell &= !flag;
        }
        was
    }
}

#[cfg(test)]
mod tests;
