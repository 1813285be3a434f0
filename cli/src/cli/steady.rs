//! Steady state in the CLI: `simulate --steps K`, `viz --steps K`, and the measured period of
//! `train` and `bench`. Kept apart from the commands so each stays a thin caller.

use std::fmt::Write as _;

use anyhow::Result;
use pipewright::runtime::StepRecord;
use pipewright::schedule::simulate::{
    period_of_starts, simulate_steps, step_starts, SimulateRequest, Simulated, SteadyState,
};
use pipewright::schedule::{Checked, CostModel, Report, Timeline, Timetable};
use serde_json::{json, Value};

use super::args::{CostArgs, SourceArgs};

pub use pipewright::sim::simulate::MAX_STEPS;

/// Check a `--steps` count: the library's check ([`pipewright::sim::simulate::check_steps`],
/// which Python's `simulate(steps=)` runs too), in the flag's words.
pub fn check_steps(steps: u32) -> Result<()> {
    pipewright::sim::simulate::check_steps(steps).map_err(|e| anyhow::anyhow!(e.named("--steps")))
}

/// The timetable and costs the flags name, simulated through the library's request (the one
/// Python's `simulate` builds too): one step, or `steps` unfenced steps.
pub fn simulated(source: &SourceArgs, costs: &CostArgs, steps: u32) -> Result<Simulated> {
    let (tt, _) = source.timetable()?;
    if steps > 1 {
        fits_steps(&tt, steps)?;
    }
    let model = costs.model(tt.num_stages(), tt.num_devices())?;
    let request = SimulateRequest::new(&tt, &model, steps)
        .map_err(|e| anyhow::anyhow!(e.named("--steps")))?;
    let mut out = request.run()?;
    if let Some(unit) = costs.time_unit()? {
        let (single, steady) = match &mut out {
            Simulated::One(sim) => (sim, None),
            Simulated::Steady(s) => (&mut s.single, Some((&mut s.timeline, &mut s.report))),
        };
        single.timeline.meta.time_unit.clone_from(&unit);
        single.report.time_unit.clone_from(&unit);
        if let Some((timeline, report)) = steady {
            timeline.meta.time_unit.clone_from(&unit);
            report.time_unit = unit;
        }
    }
    Ok(out)
}

/// Refuse `steps` unfenced steps of `tt` that this machine could not hold.
pub fn fits_steps(tt: &Timetable, steps: u32) -> Result<()> {
    Ok(pipewright::input::steps_fit(tt, steps)?)
}

/// The JSON of `simulate --steps K`: the single step and the steady state side by side,
/// each with its bubble, plus the zero-bubble paper's largest-span measure.
pub fn steady_json(s: &SteadyState) -> Value {
    let r = &s.report;
    json!({
        "steps": r.steps,
        "time_unit": r.time_unit,
        "ideal": r.ideal,
        "single_step": {
            "makespan": r.single_step_makespan,
            "bubble_fraction": r.bubble.single_step,
        },
        "steady_state": {
            "period": r.period,
            "bubble_fraction": r.bubble.steady_state,
            "device_periods": r.device_periods,
            "step_makespans": r.step_makespans,
        },
        "largest_span": {
            "span": r.largest_span,
            "bubble_fraction": r.bubble.largest_span,
        },
        "devices": s.single.report.devices.iter().map(|d| json!({
            "device": d.device, "busy": d.busy, "period": r.device_periods.get(d.device as usize),
            "peak_activations": d.peak_activations,
            "peak_activation_bytes": d.peak_activation_bytes,
        })).collect::<Vec<_>>(),
    })
}

/// The table of `simulate --steps K`.
pub fn steady_table(title: &str, s: &SteadyState) -> String {
    let r = &s.report;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title}, {} steps back to back (unfenced): ideal {:.3} per step",
        r.steps, r.ideal
    );
    let _ = writeln!(
        out,
        "  single step:  makespan {:>10.3}  bubble {:>6.2}%",
        r.single_step_makespan,
        100.0 * r.bubble.single_step
    );
    let _ = writeln!(
        out,
        "  steady state: period   {:>10.3}  bubble {:>6.2}%",
        r.period,
        100.0 * r.bubble.steady_state
    );
    let _ = writeln!(
        out,
        "  largest span: span     {:>10.3}  bubble {:>6.2}%  (the zero-bubble paper's measure)",
        r.largest_span,
        100.0 * r.bubble.largest_span
    );
    let _ = writeln!(out, "{:>6} {:>12}", "step", "makespan");
    for (k, t) in r.step_makespans.iter().enumerate() {
        let _ = writeln!(out, "{k:>6} {t:>12.3}");
    }
    let _ = writeln!(out, "{:>6} {:>12} {:>12}", "device", "busy", "period");
    for (d, p) in s.single.report.devices.iter().zip(&r.device_periods) {
        let _ = writeln!(out, "{:>6} {:>12.3} {:>12.3}", d.device, d.busy, p);
    }
    out
}

/// A K-step simulation as a chart input: its timeline and a report over all K steps.
pub fn steady_chart(s: SteadyState, costs: &CostModel) -> (Timeline, Report) {
    let report = Report::new(&s.timeline, costs);
    (s.timeline, report)
}

/// The measured steady-state period of a run, step by step: each recorded step's first
/// compute per device, moved back to the run's common clock (the runtime rebases each step's
/// timeline to its own first compute), then the simulator's own definition
/// ([`period_of_starts`], which `steady_period` and `simulate_steps` use too).
#[derive(Default)]
pub struct MeasuredPeriod {
    /// Step indices, sorted.
    steps: Vec<u64>,
    /// Per step, in step order: each device's first compute start, in ms on the run's clock.
    starts: Vec<Vec<Option<f64>>>,
}

impl MeasuredPeriod {
    /// Add a recorded step (steps may arrive in any order).
    pub fn add(&mut self, s: &StepRecord) {
        let starts = step_starts(&s.timeline)
            .into_iter()
            .map(|x| x.map(|t| t + s.origin_ms))
            .collect();
        let at = self.steps.partition_point(|&k| k < s.step);
        self.steps.insert(at, s.step);
        self.starts.insert(at, starts);
    }

    /// The period in ms so far; `None` before 2 steps.
    pub fn period_ms(&self) -> Option<f64> {
        period_of_starts(&self.starts)
    }
}

/// The end of `train`'s summary line: the measured period and the throughput it gives.
pub fn period_line(period_ms: Option<f64>, tokens: f64) -> String {
    match period_ms {
        Some(p) if p > 0.0 => format!(
            ", steady-state period {p:.1} ms ({:.0} tokens/s unfenced)",
            tokens / (p / 1e3)
        ),
        _ => String::new(),
    }
}

/// `bench`'s measured period of its recorded steps, and the simulated period of as many
/// unfenced steps (at least 3, so both skip one warm-up step the same way).
pub fn bench_periods(
    tt: &Checked,
    model: &CostModel,
    steps: &[StepRecord],
) -> Result<(Option<f64>, f64)> {
    let mut measured = MeasuredPeriod::default();
    for s in steps {
        measured.add(s);
    }
    let k = u32::try_from(steps.len())
        .unwrap_or(MAX_STEPS)
        .clamp(3, MAX_STEPS);
    let simulated = simulate_steps(tt, model, k)?.report.period;
    Ok((measured.period_ms(), simulated))
}

/// `bench`'s steady-state figures as JSON.
pub fn period_json(measured: Option<f64>, simulated: f64) -> Value {
    json!({
        "measured_period_ms": measured,
        "simulated_period_ms": simulated,
        "ratio": measured.filter(|_| simulated > 0.0).map(|m| m / simulated),
    })
}

/// `bench`'s steady-state line for people.
pub fn period_compare(measured: Option<f64>, simulated: f64) -> String {
    match measured {
        Some(m) if simulated > 0.0 => format!(
            "steady state: period measured {m:.3} ms, simulated {simulated:.3} ms ({:+.2}%)",
            100.0 * (m / simulated - 1.0)
        ),
        Some(m) => format!("steady state: period measured {m:.3} ms, simulated 0"),
        None => "steady state: needs --steps 2 or more to measure a period".to_string(),
    }
}
