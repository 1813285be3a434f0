//! Improvement by simulation: move weight-gradient work and recomputes into the idle gaps the
//! simulator finds.
//!
//! A W waits on nothing but its own I (an R on nothing but its own F), so where a device
//! idles waiting for an input, a later W or R of that device can run instead. Each move is tried on a copy, checked against the cap,
//! validated and simulated; it is kept only if the objective gets smaller (or as small, with
//! every device done sooner). Nothing unchecked survives, so the result is never worse than
//! the start.
//!
//! Under the period objective a gap counts wherever it lies inside a device's span (first to
//! last action of its step): those gaps are what unfenced steps pay for, so W work pulled
//! forward into them shortens the busiest span, and the score is the multi-step period.

use std::collections::HashMap;

use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;
use pipewright_sim::simulate::{simulate_steps, CostModel, SteadyState};

use super::memory::peak_units_kept;
use super::{Objective, PERIOD_STEPS};

/// What to improve, under which costs and cap, with how many simulations at most.
pub struct Improve<'a> {
    /// Costs per stage of the timetable.
    pub costs: &'a CostModel,
    /// Memory per stage, in units: whole, held until W, kept until an R.
    pub weights: super::recompute::Weights<'a>,
    /// Cap per device, in units.
    pub cap: f64,
    /// Most simulations to spend.
    pub budget: usize,
    /// What to minimise.
    pub objective: Objective,
    /// The search's deadline: stop improving when it passes.
    pub deadline: super::budget::Deadline,
}

/// A better timetable than `tt`, if moves into gaps found one.
pub fn improve(tt: &Checked, how: &Improve<'_>) -> Option<(Checked, SteadyState)> {
    let start = simulate_steps(tt, how.costs, PERIOD_STEPS).ok()?;
    let mut best: Option<(Checked, SteadyState)> = None;
    let mut spent = 1;
    loop {
        let (cur_tt, cur_sim) = best.as_ref().map_or((tt, &start), |(t, s)| (t, s));
        let mut moved = None;
        for (d, from, to) in gap_moves(cur_tt, cur_sim, how.deadline.clone()) {
            if spent >= how.budget || how.deadline.passed() {
                break;
            }
            spent += 1;
            let mut next = cur_tt.timetable().clone();
            let a = next.devices[d].remove(from);
            next.devices[d].insert(to, a);
            let w = how.weights;
            let peak = peak_units_kept(&next, w.weights, w.held, w.kept)
                .into_iter()
                .fold(0.0, f64::max);
            if peak > how.cap + 1e-9 {
                continue;
            }
            // A move can break the order: each moved timetable is validated afresh.
            let Ok(next) = Checked::new(next) else {
                continue;
            };
            let Ok(s) = simulate_steps(&next, how.costs, PERIOD_STEPS) else {
                continue;
            };
            if score(&s, how.objective) < score(cur_sim, how.objective) {
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

/// The objective, then the other measure, then the sum of the devices' finishing times:
/// smaller is better.
fn score(s: &SteadyState, objective: Objective) -> (f64, f64, f64) {
    let one = &s.single;
    let mut ends = vec![0.0f64; one.timeline.meta.devices as usize];
    for e in one.timeline.compute_events() {
        if let Some(x) = ends.get_mut(e.device as usize) {
            *x = x.max(e.end);
        }
    }
    let total: f64 = ends.iter().sum();
    let (period, makespan) = (s.report.period, one.report.makespan);
    match objective {
        Objective::Period => (period, makespan, total),
        Objective::Makespan => (makespan, period, total),
    }
}

/// Moves `(device, from, to)` that put a later W into an idle gap, biggest gaps first. Lazy:
/// the caller stops at its first improvement, its budget or its deadline, and finding one
/// move costs one pass over a device's row, not one per earlier action.
fn gap_moves<'a>(
    tt: &'a Timetable,
    steady: &SteadyState,
    deadline: super::budget::Deadline,
) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
    let sim = &steady.single;
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
    let positions: Vec<HashMap<(ActionKind, u32, u32), usize>> = tt
        .devices
        .iter()
        .map(|list| first_positions(list))
        .collect();
    // A gap with nothing to move costs a pass over its row: the deadline is checked per gap.
    gaps.into_iter()
        .take_while(move |_| !deadline.passed())
        .filter_map(move |(_, d, at)| {
            let list = &tt.devices[d];
            let from =
                (at + 1..list.len()).find(|&j| movable_before(list, &positions[d], j, at))?;
            Some((d, from, at))
        })
}

/// Where each (kind, stage, microbatch) first appears in a row (an overlap's parts at its
/// position).
fn first_positions(list: &[Action]) -> HashMap<(ActionKind, u32, u32), usize> {
    let mut out = HashMap::new();
    for (i, a) in list.iter().enumerate() {
        for x in a.parts() {
            out.entry((x.kind, x.stage, x.microbatch)).or_insert(i);
        }
    }
    out
}

/// Whether the W or R at `j` may run before position `at`: what it waits on (a W's own I, an
/// R's own F) already ran by then. An R pulled forward regrows its stash sooner, which the
/// cap check of the move weighs.
fn movable_before(
    list: &[Action],
    positions: &HashMap<(ActionKind, u32, u32), usize>,
    j: usize,
    at: usize,
) -> bool {
    let a = list[j];
    let needs = match a.kind {
        ActionKind::W => ActionKind::I,
        ActionKind::R => ActionKind::F,
        _ => return false,
    };
    positions
        .get(&(needs, a.stage, a.microbatch))
        .is_some_and(|&p| p < at)
}
