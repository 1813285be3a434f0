//! Steady state: K training steps back to back, with the runtime's dependencies between steps.
//!
//! The runtime does not fence steps. A device starts step `k+1` as soon as its own step `k` is
//! done: its last action (compute, or a receive it waits for), then the data-parallel
//! all-reduce of each of its stages (started after that stage's last backward, B or W, on a
//! lane of its own), then each stage's optimizer step. Other devices may still be in step `k`.
//! [`simulate_steps`] plays exactly that: the timetable repeated `K` times (step `k` uses
//! microbatches `k*m .. (k+1)*m`), one device's rows run in order, and at each step boundary
//! the device waits for its all-reduces and its optimizer time (both 0 unless the cost model
//! gives `dp_allreduce` / `optimizer`). Nothing else separates the steps.
//!
//! Over many steps the time per step is the **steady-state period**, not the single-step
//! makespan. Its definition, shared by the simulator and the runtime's measurement
//! ([`steady_period`]): let `s_d(k)` be the start of device `d`'s first compute action of step
//! `k`. A device's period is the median of `s_d(k+1) - s_d(k)` over the middle steps (every
//! step but the first, a warm-up, when there are at least 3); the period is the largest over
//! devices (the slowest device sets the pace).
//!
//! Three bubbles follow, all against `ideal`, the busiest device's compute time per step:
//! - `single_step = 1 - ideal / makespan`, a step fenced by a global barrier;
//! - `steady_state = 1 - ideal / period`, what unfenced training pays per step;
//! - `largest_span = 1 - ideal / max_d span_d`, the zero-bubble paper's measure (Qi et al.,
//!   ICLR 2024): `span_d` is device `d`'s first compute start to last compute end in one step.
//!
//! The period is at most the makespan (with no optimizer time: step `k+1` can start
//! everywhere by the end of step `k`, and a step started later by at most `t` ends later by at
//! most `t`). It equals the makespan when the device that starts first also ends last (GPipe,
//! 1F1B: device 0 runs the first F and the last backward), since then step `k+1` is step `k`
//! shifted by the makespan. It equals the largest span when the steps tile: each device starts
//! its next step the moment its own span ends, and each step is the previous one shifted
//! (zb-h2's parallelogram, say). Between the two, it is what the simulation says.

use serde::{Deserialize, Serialize};

use super::hand_off::median;
use super::{meta, prepare, CostModel, Engine, Report, SimError, Simulation};
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::timeline::{Event, Timeline, TimelineMeta};
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;

/// Why a multi-step simulation could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SteadyError {
    /// The single step could not be simulated.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// Too few steps to see a steady state, or too many microbatches in all.
    #[error("steps must be at least 2 (to see one step follow another) and steps * microbatches at most 2^32 - 1 (got {steps} steps of {microbatches} microbatches)")]
    Steps {
        /// Steps asked for.
        steps: u32,
        /// Microbatches per step.
        microbatches: u32,
    },
}

/// Bubble fractions, each `1 - ideal / time` for one notion of the time a step takes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bubbles {
    /// Against the single-step makespan (steps fenced by a global barrier).
    pub single_step: f64,
    /// Against the steady-state period (unfenced steps, as the runtime trains).
    pub steady_state: f64,
    /// Against the largest per-device span of one step (the zero-bubble paper's measure).
    pub largest_span: f64,
}

/// Figures of K steps back to back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SteadyReport {
    /// Steps simulated.
    pub steps: u32,
    /// Compute time of the busiest device in one step.
    pub ideal: f64,
    /// Makespan of one step on its own.
    pub single_step_makespan: f64,
    /// Each step's first compute start to its last event's end, in the multi-step run.
    pub step_makespans: Vec<f64>,
    /// Per device: median step-to-step advance of its first compute (see the module docs).
    pub device_periods: Vec<f64>,
    /// The steady-state period: the largest device period.
    pub period: f64,
    /// Largest per-device span (first compute start to last compute end) of one step.
    pub largest_span: f64,
    /// The three bubble fractions.
    pub bubble: Bubbles,
    /// Unit of the times.
    pub time_unit: String,
}

/// K steps simulated back to back.
#[derive(Clone, Debug, PartialEq)]
pub struct SteadyState {
    /// One step on its own (what [`simulate`] gives).
    pub single: super::Simulation,
    /// Every event of every step on one time axis; step `k` holds microbatches
    /// `k*m .. (k+1)*m` (its `meta.microbatches` is `K*m`).
    pub timeline: Timeline,
    /// The figures.
    pub report: SteadyReport,
}

/// Simulate `steps` consecutive steps of `tt` under `costs`, with the runtime's dependencies
/// between steps and no global fence (see the module docs).
pub fn simulate_steps(
    tt: &Checked,
    costs: &CostModel,
    steps: u32,
) -> Result<SteadyState, SteadyError> {
    let m = tt.microbatches;
    let bad = SteadyError::Steps {
        steps,
        microbatches: m,
    };
    if steps < 2 || m.checked_mul(steps).is_none() {
        return Err(bad);
    }
    costs
        .check_totals(tt.num_stages(), u64::from(m) * u64::from(steps))
        .map_err(SimError::from)?;
    let (lowered, host) = prepare(tt, costs)?;
    let many = repeat(&lowered, steps);
    let bounds = Boundaries::new(&lowered, costs);
    let events = Engine::new(&many, costs, Some(bounds), host.as_ref()).run();
    let timeline = Timeline {
        meta: meta(&many),
        events,
    };
    let per_step = split_steps(&timeline, m);
    // Step 0 is the single step exactly: on every device and comm stream it runs before any
    // later step's action, and from time 0 like a step on its own.
    let single = {
        let timeline = per_step[0].clone();
        let report = Report::new(&timeline, costs);
        Simulation { timeline, report }
    };
    let step_makespans = per_step.iter().map(step_makespan).collect();
    let starts: Vec<_> = per_step.iter().map(step_starts).collect();
    let device_periods = device_periods(&starts);
    let period = device_periods.iter().copied().fold(0.0, f64::max);
    let ideal = single.report.ideal;
    let makespan = single.report.makespan;
    let span = largest_span(&single.timeline);
    let report = SteadyReport {
        steps,
        ideal,
        single_step_makespan: makespan,
        step_makespans,
        device_periods,
        period,
        largest_span: span,
        bubble: Bubbles {
            single_step: idle(ideal, makespan),
            steady_state: idle(ideal, period),
            largest_span: idle(ideal, span),
        },
        time_unit: single.report.time_unit.clone(),
    };
    Ok(SteadyState {
        single,
        timeline,
        report,
    })
}

fn idle(ideal: f64, time: f64) -> f64 {
    if time > 0.0 {
        (1.0 - ideal / time).max(0.0)
    } else {
        0.0
    }
}

/// The lowered timetable `steps` times in a row; copy `k` renumbers microbatch `j` to `k*m + j`.
fn repeat(tt: &Timetable, steps: u32) -> Timetable {
    let m = tt.microbatches;
    let devices = tt
        .devices
        .iter()
        .map(|row| {
            (0..steps)
                .flat_map(|k| row.iter().map(move |&a| shifted(a, k * m)))
                .collect()
        })
        .collect();
    Timetable {
        name: tt.name.clone(),
        microbatches: m * steps,
        stage_device: tt.stage_device.clone(),
        devices,
    }
}

/// A multi-step timeline cut into its steps (microbatch `j` belongs to step `j / m`), each
/// renumbered to microbatches `0..m`, times kept on the common axis.
pub fn split_steps(timeline: &Timeline, m: u32) -> Vec<Timeline> {
    let m = m.max(1);
    let steps = timeline.meta.microbatches.div_ceil(m) as usize;
    let meta = TimelineMeta {
        microbatches: m,
        ..timeline.meta.clone()
    };
    let mut out: Vec<Timeline> = (0..steps.max(1))
        .map(|_| Timeline {
            meta: meta.clone(),
            events: Vec::new(),
        })
        .collect();
    for e in &timeline.events {
        let k = (e.action.microbatch / m) as usize;
        if let Some(step) = out.get_mut(k) {
            let mut e = *e;
            e.action = renumber(e.action, m);
            step.events.push(e);
        }
    }
    out
}

/// `a` with every microbatch it names (an overlap's backward part too) moved up by `by`.
fn shifted(a: Action, by: u32) -> Action {
    let kind = match a.kind {
        ActionKind::Overlap {
            b_stage,
            b_microbatch,
        } => ActionKind::Overlap {
            b_stage,
            b_microbatch: b_microbatch + by,
        },
        k => k,
    };
    Action {
        microbatch: a.microbatch + by,
        kind,
        ..a
    }
}

fn renumber(a: Action, m: u32) -> Action {
    let kind = match a.kind {
        ActionKind::Overlap {
            b_stage,
            b_microbatch,
        } => ActionKind::Overlap {
            b_stage,
            b_microbatch: b_microbatch % m,
        },
        k => k,
    };
    Action {
        microbatch: a.microbatch % m,
        kind,
        ..a
    }
}

/// Start of each device's first compute action in `timeline` (`None` for an idle device).
pub fn step_starts(timeline: &Timeline) -> Vec<Option<f64>> {
    let mut starts = vec![None; timeline.meta.devices as usize];
    for e in timeline.compute_events() {
        if let Some(s) = starts.get_mut(e.device as usize) {
            *s = Some(s.map_or(e.start, |x: f64| x.min(e.start)));
        }
    }
    starts
}

/// The steady-state period of consecutive steps on one time axis: for each device the median
/// advance of its first compute start from step to step, skipping the warm-up step when there
/// are at least 3; the largest over devices. `None` with fewer than 2 steps.
///
/// The simulator and the runtime's measurement both call this, so "period" means one thing.
pub fn steady_period(steps: &[Timeline]) -> Option<f64> {
    let starts: Vec<_> = steps.iter().map(step_starts).collect();
    period_of_starts(&starts)
}

/// [`steady_period`] from each step's [`step_starts`] (on one clock), for a caller that keeps
/// only the starts of a long run, not its timelines.
pub fn period_of_starts(starts: &[Vec<Option<f64>>]) -> Option<f64> {
    if starts.len() < 2 {
        return None;
    }
    let periods = device_periods(starts);
    (!periods.is_empty()).then(|| periods.iter().copied().fold(0.0, f64::max))
}

/// Each device's median step-to-step advance (0 for a device with no compute).
fn device_periods(starts: &[Vec<Option<f64>>]) -> Vec<f64> {
    let devices = starts.iter().map(Vec::len).max().unwrap_or(0);
    let from = usize::from(starts.len() >= 3);
    (0..devices)
        .map(|d| {
            let mut diffs: Vec<f64> = (from..starts.len().saturating_sub(1))
                .filter_map(|k| Some(starts[k + 1].get(d).copied()?? - starts[k].get(d).copied()??))
                .collect();
            median(&mut diffs).unwrap_or(0.0)
        })
        .collect()
}

/// A step's first compute start to its last event's end (what the runtime reports per step).
fn step_makespan(step: &Timeline) -> f64 {
    let first = step_starts(step)
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
    let end = step.makespan();
    if first.is_finite() {
        (end - first).max(0.0)
    } else {
        0.0
    }
}

/// The largest time any device spends from its first compute start to its last compute end.
pub fn largest_span(timeline: &Timeline) -> f64 {
    let n = timeline.meta.devices as usize;
    let mut first = vec![f64::INFINITY; n];
    let mut last = vec![f64::NEG_INFINITY; n];
    for e in timeline.compute_events() {
        let d = e.device as usize;
        if d < n {
            first[d] = first[d].min(e.start);
            last[d] = last[d].max(e.end);
        }
    }
    first
        .iter()
        .zip(&last)
        .filter(|(f, _)| f.is_finite())
        .map(|(f, l)| l - f)
        .fold(0.0, f64::max)
}

/// What the engine needs at step boundaries: per device, one step's row length, where each
/// stage's gradients become final, the all-reduce lane and the optimizer time.
pub(super) struct Boundaries {
    row_len: Vec<usize>,
    /// Per device, per row index: stages whose last backward (B or W) is that action.
    last_backward: Vec<Vec<Vec<u32>>>,
    /// Per device: the last row index whose boundary has been applied.
    entered: Vec<usize>,
    /// Per device: end of its latest compute or awaited receive.
    step_end: Vec<f64>,
    /// Per device: when its all-reduce lane is free (the last all-reduce's end).
    lane: Vec<f64>,
    /// Per device: optimizer time of all its stages.
    optimizer: Vec<f64>,
}

impl Boundaries {
    pub(super) fn new(tt: &Timetable, costs: &CostModel) -> Self {
        let n = tt.devices.len();
        let mut optimizer = vec![0.0; n];
        for (s, &d) in tt.stage_device.iter().enumerate() {
            if let (Some(o), Some(c)) = (optimizer.get_mut(d as usize), costs.stages.get(s)) {
                *o += c.optimizer;
            }
        }
        let last_backward = tt
            .devices
            .iter()
            .map(|row| {
                let mut at = vec![Vec::new(); row.len()];
                let mut seen = std::collections::HashSet::new();
                for (i, a) in row.iter().enumerate().rev() {
                    for p in a.parts() {
                        if matches!(p.kind, ActionKind::B | ActionKind::W) && seen.insert(p.stage) {
                            at[i].push(p.stage);
                        }
                    }
                }
                at
            })
            .collect();
        Boundaries {
            row_len: tt.devices.iter().map(Vec::len).collect(),
            last_backward,
            entered: vec![0; n],
            step_end: vec![0.0; n],
            lane: vec![0.0; n],
            optimizer,
        }
    }

    /// Before device `d` runs row index `pc`: at the start of a new step, it waits for its
    /// own previous step, its all-reduces, then its optimizer.
    pub(super) fn enter(&mut self, d: usize, pc: usize, compute_free: &mut f64) {
        let len = self.row_len[d];
        if len == 0 || pc == 0 || pc % len != 0 || self.entered[d] >= pc {
            return;
        }
        self.entered[d] = pc;
        let ready = compute_free.max(self.step_end[d]).max(self.lane[d]);
        *compute_free = ready + self.optimizer[d];
    }

    /// After device `d` ran row index `pc` as event `e`.
    pub(super) fn done(&mut self, d: usize, pc: usize, e: &Event, costs: &CostModel) {
        if !matches!(e.action.kind, ActionKind::SendF | ActionKind::SendB) {
            self.step_end[d] = self.step_end[d].max(e.end);
        }
        let len = self.row_len[d];
        for &s in &self.last_backward[d][pc % len] {
            let t = costs.stages.get(s as usize).map_or(0.0, |c| c.dp_allreduce);
            if t > 0.0 {
                self.lane[d] = self.lane[d].max(e.end) + t;
            }
        }
    }
}

#[cfg(test)]
mod tests;
