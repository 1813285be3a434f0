//! Improvement by simulation: move weight-gradient work into the idle gaps the simulator finds.
//!
//! A W waits on nothing but its own I, so where a device idles waiting for an input, a later W
//! of that device can run instead. Each move is tried on a copy, checked against the cap,
//! validated and simulated; it is kept only if the step gets shorter (or as short, with every
//! device done sooner). Nothing unchecked survives, so the result is never worse than the start.

use crate::action::{Action, ActionKind};
use crate::simulate::{simulate, CostModel, Simulation};
use crate::timetable::Timetable;

use super::memory::peak_units;

/// What to improve, under which costs and cap, with how many simulations at most.
pub struct Improve<'a> {
    /// Costs per stage of the timetable.
    pub costs: &'a CostModel,
    /// Memory weight per stage, in units.
    pub weights: &'a [f64],
    /// Cap per device, in units.
    pub cap: f64,
    /// Most simulations to spend.
    pub budget: usize,
}

/// A better timetable than `tt`, if moves into gaps found one.
pub fn improve(
    tt: &Timetable,
    sim: &Simulation,
    how: &Improve<'_>,
) -> Option<(Timetable, Simulation)> {
    let mut best: Option<(Timetable, Simulation)> = None;
    let mut spent = 0;
    loop {
        let (cur_tt, cur_sim) = best.as_ref().map_or((tt, sim), |(t, s)| (t, s));
        let mut moved = None;
        for (d, from, to) in gap_moves(cur_tt, cur_sim) {
            if spent >= how.budget {
                break;
            }
            spent += 1;
            let mut next = cur_tt.clone();
            let a = next.devices[d].remove(from);
            next.devices[d].insert(to, a);
            let peak = peak_units(&next, how.weights)
                .into_iter()
                .fold(0.0, f64::max);
            if peak > how.cap + 1e-9 {
                continue;
            }
            let Ok(s) = simulate(&next, how.costs) else {
                continue;
            };
            if score(&s) < score(cur_sim) {
                moved = Some((next, s));
                break;
            }
        }
        match moved {
            Some(m) => best = Some(m),
            None => return best,
        }
    }
}

/// Makespan, then the sum of the devices' finishing times: smaller is better.
fn score(s: &Simulation) -> (f64, f64) {
    let mut ends = vec![0.0f64; s.timeline.meta.devices as usize];
    for e in s.timeline.compute_events() {
        if let Some(x) = ends.get_mut(e.device as usize) {
            *x = x.max(e.end);
        }
    }
    let total: f64 = ends.iter().sum();
    (s.report.makespan, total)
}

/// Moves `(device, from, to)` that put a later W into an idle gap, biggest gaps first.
fn gap_moves(tt: &Timetable, sim: &Simulation) -> Vec<(usize, usize, usize)> {
    let mut gaps: Vec<(f64, usize, usize)> = Vec::new();
    let mut prev_end = vec![sim.timeline.start(); tt.devices.len()];
    let mut index = vec![0usize; tt.devices.len()];
    for e in sim.timeline.compute_events() {
        let d = e.device as usize;
        let gap = e.start - prev_end[d];
        if gap > 1e-9 {
            gaps.push((gap, d, index[d]));
        }
        prev_end[d] = e.end;
        index[d] += 1;
    }
    gaps.sort_by(|a, b| b.0.total_cmp(&a.0));
    gaps.into_iter()
        .filter_map(|(_, d, at)| {
            let list = &tt.devices[d];
            let from = (at + 1..list.len()).find(|&j| movable_before(list, j, at))?;
            Some((d, from, at))
        })
        .collect()
}

/// Whether the W at `j` may run before position `at`: its own I already ran by then.
fn movable_before(list: &[Action], j: usize, at: usize) -> bool {
    let a = list[j];
    a.kind == ActionKind::W
        && list[..at]
            .iter()
            .any(|x| x.kind == ActionKind::I && x.stage == a.stage && x.microbatch == a.microbatch)
}
