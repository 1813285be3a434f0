//! The memory walk done once per timetable and replayed per configuration: the plan checks
//! thousands of configurations that share a few hundred timetables, and each walk (see
//! `timeline`) depends on the configuration only through a handful of byte figures.
//!
//! A device's stash at any moment of the walk is a sum, with whole-number coefficients, of
//! four figures per stage (`kept`, `full - kept`, `weight`, `whole`, see [`StageBytes`]),
//! and its buffers a whole number of hand-offs, as long as hand-offs are alike and nothing
//! is reduced into a buffer (the Megatron accounting of a GPT). [`Profile`] records those
//! coefficients at every moment the walk compares with its peak; [`predict_profiled`] puts
//! a configuration's figures in and takes the first highest moment, as the walk does.
//!
//! Exactly the walk's answer: the figures are whole numbers, and where every sum the walk
//! forms stays below 2^53 its floating-point sums are exact, so the order they are added
//! in does not matter. A moment that an earlier one bounds in every coefficient can never
//! be the first highest (all figures are non-negative), so it is left out. A stage whose
//! kept stash equals its full one (no recomputation) is walked as one whose backward grows
//! it by nothing: a moment of no growth is bounded by the one before it, so it changes
//! nothing. Any other configuration (a layer list's hand-offs, reduced gradients, a
//! figure past 2^53) is walked as before.

use std::collections::{BTreeSet, HashSet};

use super::timeline::BufferBytes;
use super::walk::StageBytes;
use super::{dispatch_most, params, predict, prepare, MemoryBreakdown, MemoryConfig, MemoryError};
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::recompute::{kept_whole, recomputed};
use pipewright_schedule::timetable::{lower, Timetable};

/// Moments a new one is compared with for bounding (more costs time on long rows and
/// rarely leaves out more).
const RECENT: usize = 16;

/// A timetable's walk, per device, with the bytes left symbolic.
#[derive(Clone, Debug)]
pub struct Profile {
    tt: Timetable,
    recomputed: BTreeSet<u32>,
    devices: Vec<Moments>,
}

/// One device's moments: for each of its stages `kept`, `full - kept`, `weight` and
/// `whole`, then hand-offs, `width` coefficients a moment, in the walk's order.
#[derive(Clone, Debug)]
struct Moments {
    stages: Vec<u32>,
    width: usize,
    coefs: Vec<i32>,
    /// The largest sum of coefficients' sizes at any point of the walk: how large a sum of
    /// figures the walk forms.
    most: u64,
}

impl Profile {
    /// Walk `tt` (lowered first, as the memory model does) once.
    pub fn new(tt: &Timetable) -> Result<Self, MemoryError> {
        let low = if tt.is_lowered() {
            tt.clone()
        } else {
            lower(tt).map_err(|e| MemoryError::Lower(e.to_string()))?
        };
        let devices = low
            .devices
            .iter()
            .map(|row| Moments::walk(row, low.num_stages()))
            .collect();
        Ok(Profile {
            tt: tt.clone(),
            recomputed: recomputed(tt),
            devices,
        })
    }

    /// The timetable walked.
    pub fn timetable(&self) -> &Timetable {
        &self.tt
    }
}

/// What [`super::predict`] gives for `cfg` over `profile`'s timetable, from the recorded
/// walk where the bytes allow (see the module docs), else from walking it.
pub fn predict_profiled(
    cfg: &MemoryConfig,
    profile: &Profile,
) -> Result<Vec<MemoryBreakdown>, MemoryError> {
    let tt = &profile.tt;
    let (full, stages, buffers) = &prepare(cfg, tt, &profile.recomputed)?;
    let Some(handoff) = symbolic_handoff(stages, buffers) else {
        return predict(cfg, tt);
    };
    let mut out = Vec::with_capacity(profile.devices.len());
    for (d, dev) in profile.devices.iter().enumerate() {
        let Some((act, buf)) = dev.peak(stages, handoff) else {
            return predict(cfg, tt);
        };
        let d = d as u32;
        let mut m = MemoryBreakdown {
            activations: act.round() as u64,
            buffers: buf.round() as u64,
            ..params::device_state(full, tt, d)
        };
        m.buffers = m.buffers.saturating_add(dispatch_most(full, tt, d));
        out.push(m);
    }
    Ok(out)
}

/// The hand-off, where buffers are whole numbers of it and stages keep no more than their
/// full stash; `None` where the recorded walk does not apply.
fn symbolic_handoff(stages: &[StageBytes], buf: &BufferBytes) -> Option<f64> {
    let plain =
        buf.outputs.is_none() && buf.shards.is_none() && buf.grads.iter().all(|&g| g == 0.0);
    (plain && stages.iter().all(|s| s.kept <= s.full)).then_some(buf.handoff)
}

/// `x` as a whole number the walk sums exactly, if it is one.
fn whole(x: f64) -> Option<i64> {
    (x >= 0.0 && x.fract() == 0.0 && x < EXACT).then_some(x as i64)
}

/// Below this, every whole number is an `f64`.
const EXACT: f64 = 9_007_199_254_740_992.0;

impl Moments {
    /// The first highest moment's `(activations, buffers)` under `stages` and `handoff`;
    /// `None` where a sum could pass 2^53.
    fn peak(&self, stages: &[StageBytes], handoff: f64) -> Option<(f64, f64)> {
        let mut figures = Vec::with_capacity(self.width);
        let mut largest = whole(handoff)?;
        for &s in &self.stages {
            let c = stages.get(s as usize).copied().unwrap_or_default();
            for x in [c.kept, c.full - c.kept, c.weight, c.whole] {
                let x = whole(x)?;
                largest = largest.max(x);
                figures.push(x);
            }
        }
        figures.push(whole(handoff)?);
        if (self.most as f64) * (largest as f64) >= EXACT {
            return None;
        }
        let (mut best, mut best_sum) = ((0i64, 0i64), 0i64);
        for moment in self.coefs.chunks_exact(self.width) {
            let (stash, hand) = moment.split_at(self.width - 1);
            let act: i64 = stash
                .iter()
                .zip(&figures)
                .map(|(&c, &x)| i64::from(c) * x)
                .sum();
            let buf = i64::from(hand[0]) * figures[self.width - 1];
            if act + buf > best_sum {
                (best, best_sum) = ((act, buf), act + buf);
            }
        }
        Some((best.0 as f64, best.1 as f64))
    }

    /// Record the walk of one lowered row of a pipeline of `num_stages` stages: the same
    /// steps as `timeline::device_levels` with `Stashes`, counting figures instead of
    /// adding bytes.
    fn walk(row: &[Action], num_stages: u32) -> Self {
        let mut stages: Vec<u32> = row
            .iter()
            .flat_map(|a| a.parts())
            .filter(|p| !p.kind.is_comm() && p.stage < num_stages)
            .map(|p| p.stage)
            .collect();
        stages.sort_unstable();
        stages.dedup();
        let mut w = Walker {
            local: stages.clone(),
            now: vec![0; 4 * stages.len() + 1],
            whole: kept_whole(row),
            slim: HashSet::new(),
            seen: HashSet::new(),
            moments: Vec::new(),
            most: 0,
        };
        for a in row {
            w.action(*a, num_stages);
        }
        Moments {
            width: 4 * stages.len() + 1,
            stages,
            coefs: w.moments.concat(),
            most: w.most,
        }
    }
}

/// The symbolic walk's state: the coefficients held now, and the moments kept so far.
struct Walker {
    local: Vec<u32>,
    now: Vec<i32>,
    whole: HashSet<(u32, u32)>,
    slim: HashSet<(u32, u32)>,
    seen: HashSet<Vec<i32>>,
    moments: Vec<Vec<i32>>,
    most: u64,
}

/// Offsets of a stage's figures.
const KEPT: usize = 0;
const GROWS: usize = 1;
const WEIGHT: usize = 2;
const WHOLE: usize = 3;

impl Walker {
    fn hand(&mut self, by: i32) {
        let last = self.now.len() - 1;
        self.now[last] += by;
        self.note();
    }

    /// Change stage `s`'s figure at `at` by `by`.
    fn stash(&mut self, s: u32, at: usize, by: i32) {
        if let Ok(i) = self.local.binary_search(&s) {
            self.now[4 * i + at] += by;
        }
        self.note();
    }

    /// Track how large the sums get.
    fn note(&mut self) {
        let size: u64 = self.now.iter().map(|c| u64::from(c.unsigned_abs())).sum();
        self.most = self.most.max(size);
    }

    /// The walk compares the present with its peak: keep it unless an earlier moment
    /// bounds it.
    fn see(&mut self) {
        let bounded = self.seen.contains(&self.now)
            || self
                .moments
                .iter()
                .rev()
                .take(RECENT)
                .any(|m| m.iter().zip(&self.now).all(|(a, b)| a >= b));
        if !bounded {
            self.seen.insert(self.now.clone());
            self.moments.push(self.now.clone());
        }
    }

    fn action(&mut self, a: Action, num_stages: u32) {
        let first = |s: u32| s == 0;
        match a.kind {
            ActionKind::RecvF => {
                self.hand(i32::from(!first(a.stage)));
                self.see();
            }
            ActionKind::RecvB => {
                self.hand(1);
                self.see();
            }
            ActionKind::SendF => self.hand(-1),
            ActionKind::SendB => self.hand(-i32::from(!first(a.stage))),
            _ => {
                for part in a.parts() {
                    let last = part.stage + 1 == num_stages;
                    let (takes, makes) = match part.kind {
                        ActionKind::F => (!first(part.stage), !last),
                        ActionKind::B | ActionKind::I => (!last, !first(part.stage)),
                        _ => (false, false),
                    };
                    if takes {
                        self.hand(-1);
                    }
                    self.apply(part);
                    if makes {
                        self.hand(1);
                        self.see();
                    }
                }
            }
        }
    }

    /// `Stashes::apply`, with every stage's kept stash at most its full one.
    fn apply(&mut self, part: Action) {
        let (s, key) = (part.stage, (part.stage, part.microbatch));
        match part.kind {
            ActionKind::F if self.whole.contains(&key) => self.grow(s, WHOLE),
            ActionKind::F => {
                self.slim.insert(key);
                self.grow(s, KEPT);
            }
            ActionKind::R if self.slim.remove(&key) => self.grow(s, GROWS),
            ActionKind::B | ActionKind::I => {
                if self.slim.remove(&key) {
                    self.grow(s, GROWS);
                }
                if self.whole.contains(&key) {
                    self.stash(s, WHOLE, -1);
                } else {
                    self.stash(s, KEPT, -1);
                    self.stash(s, GROWS, -1);
                }
                if part.kind == ActionKind::I {
                    self.grow(s, WEIGHT);
                }
            }
            ActionKind::W => self.stash(s, WEIGHT, -1),
            _ => {}
        }
    }

    fn grow(&mut self, s: u32, at: usize) {
        self.stash(s, at, 1);
        self.see();
    }
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
