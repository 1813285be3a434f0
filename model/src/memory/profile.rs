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
//! in does not matter; moments that cannot change the answer are left out (see
//! `Moments`). A stage whose kept stash equals its full one (no recomputation) is walked as
//! one whose backward grows it by nothing: every growth in the walk is compared at once, so
//! a moment of no growth holds no more than the one compared before it, and changes
//! nothing. Any other configuration (a layer list's hand-offs, reduced gradients, a
//! figure past 2^53) is walked as before.

use std::collections::BTreeSet;

use super::timeline::BufferBytes;
use super::walk::StageBytes;
use super::{dispatch_most, params, predict, prepare, MemoryBreakdown, MemoryConfig, MemoryError};
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::recompute::recomputed;
use pipewright_schedule::stash::{Change, Form, StashWalk};
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

/// One device's moments: a coefficient for each figure in `columns` (a stage and which of
/// `kept`, `full - kept`, `weight` and `whole`; those never held are left out), then one of
/// hand-offs; `columns.len() + 1` coefficients a moment, in the walk's order.
///
/// Two kinds of moment are left out, as neither changes the first highest moment's
/// activations and buffers for any non-negative figures: one that an earlier moment bounds
/// in every coefficient (it never passes the peak so far), and one that the next moment
/// bounds (where that one is not higher, the difference of the two is worth nothing, so
/// both hold the same).
#[derive(Clone, Debug)]
struct Moments {
    /// The device's stages.
    stages: Vec<u32>,
    columns: Vec<(u32, usize)>,
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
        let width = self.columns.len() + 1;
        let mut figures = Vec::with_capacity(width);
        for &(s, at) in &self.columns {
            let c = stages.get(s as usize).copied().unwrap_or_default();
            figures.push(whole([c.kept, c.full - c.kept, c.weight, c.whole][at])?);
        }
        let hand = whole(handoff)?;
        // Every figure of the device's stages counts here, held at a moment or not.
        let mut largest = hand;
        for &s in &self.stages {
            let c = stages.get(s as usize).copied().unwrap_or_default();
            for x in [c.kept, c.full - c.kept, c.weight, c.whole] {
                largest = largest.max(whole(x)?);
            }
        }
        if (self.most as f64) * (largest as f64) >= EXACT {
            return None;
        }
        let (mut best, mut best_sum) = ((0i64, 0i64), 0i64);
        for moment in self.coefs.chunks_exact(width) {
            let act: i64 = moment
                .iter()
                .zip(&figures)
                .map(|(&c, &x)| i64::from(c) * x)
                .sum();
            let buf = i64::from(moment[width - 1]) * hand;
            if act + buf > best_sum {
                (best, best_sum) = ((act, buf), act + buf);
            }
        }
        Some((best.0 as f64, best.1 as f64))
    }

    /// Record the walk of one lowered row of a pipeline of `num_stages` stages: the same
    /// steps as `timeline::device_levels` with `Stashes` (the schedule's stash walk),
    /// counting figures instead of adding bytes. A stage past `num_stages` holds nothing
    /// there: left out.
    fn walk(row: &[Action], num_stages: u32) -> Self {
        let mut local: Vec<u32> = row
            .iter()
            .flat_map(|a| a.parts())
            .filter(|p| !p.kind.is_comm() && p.stage < num_stages)
            .map(|p| p.stage)
            .collect();
        local.sort_unstable();
        local.dedup();
        let mut w = Walker {
            now: vec![0; 4 * local.len() + 1],
            stashes: StashWalk::new(row),
            moments: Vec::new(),
            size: 0,
            most: 0,
            local,
        };
        for a in row {
            w.action(*a, num_stages);
        }
        w.finish()
    }
}

/// The symbolic walk's state: the coefficients held now, and the moments kept so far.
struct Walker {
    /// The device's stages, ascending.
    local: Vec<u32>,
    now: Vec<i32>,
    /// The schedule's stash walk over the row: what each part stashes, rebuilds and frees.
    stashes: StashWalk,
    /// Moments, `now.len()` coefficients each.
    moments: Vec<i32>,
    /// The sum of the coefficients' sizes now, and its largest so far.
    size: u64,
    most: u64,
}

/// Offsets of a stage's figures.
const KEPT: usize = 0;
const GROWS: usize = 1;
const WEIGHT: usize = 2;
const WHOLE: usize = 3;

impl Walker {
    /// Change coefficient `i` by `by` (1 or -1).
    fn change(&mut self, i: usize, by: i32) {
        let before = self.now[i].unsigned_abs();
        self.now[i] += by;
        if self.now[i].unsigned_abs() > before {
            self.size += 1;
            self.most = self.most.max(self.size);
        } else {
            self.size -= 1;
        }
    }

    fn hand(&mut self, by: i32) {
        if by != 0 {
            self.change(self.now.len() - 1, by);
        }
    }

    /// Change stage `s`'s figure at `at` by `by`.
    fn stash(&mut self, s: u32, at: usize, by: i32) {
        if let Ok(i) = self.local.binary_search(&s) {
            self.change(4 * i + at, by);
        }
    }

    /// The walk compares the present with its peak: keep it unless one of the last
    /// moments bounds it, and drop the moments just before it that it bounds (see
    /// [`Moments`]).
    fn see(&mut self) {
        let width = self.now.len();
        let bounds = |m: &[i32], n: &[i32]| m.iter().zip(n).all(|(a, b)| a >= b);
        if (self.moments.rchunks_exact(width).take(RECENT)).any(|m| bounds(m, &self.now)) {
            return;
        }
        while self.moments.len() >= width
            && bounds(&self.now, &self.moments[self.moments.len() - width..])
        {
            self.moments.truncate(self.moments.len() - width);
        }
        self.moments.extend_from_slice(&self.now);
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
                    // A part changes at most two things (a rebuild, then a free or split).
                    let mut changes = [None; 2];
                    let mut n = 0;
                    self.stashes.step(part, |c| {
                        changes[n.min(1)] = Some(c);
                        n += 1;
                    });
                    if self.local.binary_search(&part.stage).is_ok() {
                        for c in changes.into_iter().flatten() {
                            self.apply(part.stage, c);
                        }
                    }
                    if makes {
                        self.hand(1);
                        self.see();
                    }
                }
            }
        }
    }

    /// `Stashes::apply`: stage `s`'s figures as the walk's change `c` moves them.
    fn apply(&mut self, s: u32, c: Change) {
        let figure = |form: Form| if form == Form::Whole { WHOLE } else { KEPT };
        match c {
            Change::Stash(form) => self.grow(s, figure(form)),
            Change::Rebuild(_) => self.grow(s, GROWS),
            Change::Free(form) | Change::Split(form) => {
                if form == Form::Whole {
                    self.stash(s, WHOLE, -1);
                } else {
                    self.stash(s, KEPT, -1);
                    self.stash(s, GROWS, -1);
                }
                if matches!(c, Change::Split(_)) {
                    self.grow(s, WEIGHT);
                }
            }
            Change::FreeWeight => self.stash(s, WEIGHT, -1),
        }
    }

    fn grow(&mut self, s: u32, at: usize) {
        self.stash(s, at, 1);
        self.see();
    }

    /// The moments, figures never held in any left out.
    fn finish(self) -> Moments {
        let width = self.now.len();
        let used: Vec<usize> = (0..width - 1)
            .filter(|&i| self.moments.chunks_exact(width).any(|m| m[i] != 0))
            .collect();
        let coefs = self
            .moments
            .chunks_exact(width)
            .flat_map(|m| used.iter().map(|&i| m[i]).chain([m[width - 1]]))
            .collect();
        Moments {
            columns: used.iter().map(|&i| (self.local[i / 4], i % 4)).collect(),
            stages: self.local,
            coefs,
            most: self.most,
        }
    }
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
