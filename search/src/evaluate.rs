//! Evaluating the search's jobs: build each timetable, simulate it over the steady state,
//! judge it against the cap, and keep only the best fitting one.

use super::{
    budget, fixed_label, key, list_schedule, peak_units_kept, recompute, refused, round_schedule,
    whole, Candidate, Job, MemoryCap, Ordered, Progress, SearchSpec, Shape, PERIOD_STEPS,
};
use pipewright_schedule::generators::generate;
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;
use pipewright_sim::simulate::{simulate_steps, SimError, Simulation, SteadyError, SteadyState};

pub(super) type Evaluated = Result<Candidate, (String, String)>;

/// The best fitting timetable so far, and the job that made it.
pub(super) struct Best {
    pub(super) job: usize,
    /// The objective, the peak, and 1 for the list scheduler and the rounds heuristic: a fixed
    /// family wins a tie whichever was evaluated first (and among the others, the earlier job).
    pub(super) key: (Ordered, Ordered, u8),
    pub(super) timetable: Checked,
    pub(super) simulation: Simulation,
}

/// Evaluate the jobs in [`budget::order`] until all are done or the deadline has passed:
/// `(job index, result)` in the order evaluated, at least one. A fixed family whose peak is over a cap in
/// microbatches cannot win, so it is simulated (for the Pareto front) only after every job
/// that can; the deadline then cuts those first. Only the best fitting timetable is kept
/// (large searches make hundreds of them). Sequential on purpose: this crate has no
/// threads, and the budget bounds the time (BENCHMARKS.md).
pub(super) fn evaluate_all(
    jobs: &[Job],
    spec: &SearchSpec,
    shapes: &[Option<Shape>],
    unit: Option<f64>,
    deadline: budget::Deadline,
    on_progress: &mut dyn FnMut(&Progress),
) -> (Vec<(usize, Evaluated)>, Option<Best>) {
    let mut best: Option<Best> = None;
    let mut best_label = None;
    let mut all = Vec::with_capacity(jobs.len());
    let order = budget::order(jobs, spec.devices, spec.microbatches);
    // Over-cap fixed families are met on the first pass and put off to the second.
    let mut over = Vec::new();
    let mut k = 0;
    loop {
        let (i, first) = match (order.get(k), over.get(k.wrapping_sub(order.len()))) {
            (Some(&i), _) => (i, true),
            (None, Some(&i)) => (i, false),
            (None, None) => break,
        };
        k += 1;
        // The first job always runs (the likeliest to fit), so any budget returns something.
        if !all.is_empty() && deadline.passed() {
            break;
        }
        let job = &jobs[i];
        let generated = match (first, job) {
            (true, Job::Fixed(s)) => Some(generate(s)),
            _ => None,
        };
        if generated
            .as_ref()
            .is_some_and(|tt| over_cap(tt, job, spec, shapes))
        {
            over.push(i);
            continue;
        }
        let result = match evaluate(job, spec, shapes, unit, generated) {
            Ok((cand, Some((timetable, simulation)))) => {
                let (a, b) = key(&cand, spec.objective);
                let k = (a, b, u8::from(!matches!(job, Job::Fixed(_))));
                if best.as_ref().map_or(true, |b| k < b.key) {
                    best_label = Some(cand.label.clone());
                    best = Some(Best {
                        job: i,
                        key: k,
                        timetable,
                        simulation,
                    });
                }
                Ok(cand)
            }
            Ok((cand, None)) => Ok(cand),
            Err(e) => Err(e),
        };
        all.push((i, result));
        on_progress(&Progress {
            done: all.len(),
            total: jobs.len(),
            best: best.as_ref().map(|b| b.key.0 .0),
            best_label: best_label.clone(),
        });
    }
    (all, best)
}

/// Whether a fixed family's timetable is over a cap in microbatches, by the same peak
/// [`describe`] judges it by (generating a timetable is cheap beside simulating it).
fn over_cap(tt: &Timetable, job: &Job, spec: &SearchSpec, shapes: &[Option<Shape>]) -> bool {
    let MemoryCap::Microbatches(cap) = spec.cap else {
        return false;
    };
    let Some(shape) = &shapes[job.v() as usize] else {
        return false;
    };
    let peak = peak_units_kept(tt, &shape.weights, &shape.held, &shape.kept)
        .into_iter()
        .fold(0.0, f64::max);
    peak > cap + 1e-9
}

type Kept = Option<(Checked, Simulation)>;

/// Evaluate one job; `generated` is a fixed family's timetable when already made.
fn evaluate(
    job: &Job,
    spec: &SearchSpec,
    shapes: &[Option<Shape>],
    unit: Option<f64>,
    generated: Option<Timetable>,
) -> Result<(Candidate, Kept), (String, String)> {
    let Some(shape) = &shapes[job.v() as usize] else {
        return Err(("?".into(), "no costs".into()));
    };
    let (label, family, tt) = build(job, spec, shapes, generated)?;
    if let Some(why) = refused(&tt, spec) {
        return Err((label, why.into()));
    }
    // Validated once here; the simulator takes it as checked.
    let tt = Checked::new(tt).map_err(|e| (label.clone(), SimError::from(e).to_string()))?;
    let sim = simulate_steps(&tt, &shape.costs, PERIOD_STEPS)
        .map_err(|e| (label.clone(), steady_reason(e)))?;
    let cand = describe((label, family, job.v()), &tt, &sim, shape, unit, spec);
    let fits = cand.fits;
    let kept = fits.then_some((tt, sim.single));
    Ok((cand, kept))
}

/// The label, family and timetable of a job; `generated` is a fixed family's timetable when
/// already made.
pub(super) fn build(
    job: &Job,
    spec: &SearchSpec,
    shapes: &[Option<Shape>],
    generated: Option<Timetable>,
) -> Result<(String, String, Timetable), (String, String)> {
    let (p, m) = (spec.devices, spec.microbatches);
    let Some(shape) = &shapes[job.v() as usize] else {
        return Err(("?".into(), "no costs".into()));
    };
    Ok(match job {
        Job::Fixed(s) => (
            fixed_label(s.kind(), s.virtual_stages(), grouped(s)),
            s.kind().name().to_string(),
            generated.unwrap_or_else(|| generate(s)),
        ),
        Job::List(k) => match list_schedule(p, m, &shape.costs, &shape.weights, *k) {
            Some(tt) => (k.label(), "list".to_string(), tt),
            None => return Err((k.label(), "the cap stops every device at once".into())),
        },
        Job::Rounds(k, cap) => {
            let (costs, weights, held) = (&shape.costs, &shape.weights, &shape.held);
            match round_schedule(p, m, costs, weights, held, *cap, *k) {
                Some(tt) => (k.label(*cap), "list".to_string(), tt),
                None => return Err((k.label(*cap), "a forward does not fit the cap".into())),
            }
        }
        Job::Recompute(s, cap) => {
            let base = fixed_label(s.kind(), s.virtual_stages(), grouped(s));
            let tt = recompute::fit(&generate(s), shape.weights(), *cap);
            let (r, f) = recompute::count(&tt);
            let label = format!("{base} + recompute {r}/{f}");
            (label, s.kind().name().to_string(), tt)
        }
    })
}

fn steady_reason(e: SteadyError) -> String {
    match e {
        SteadyError::Sim(e) => e.to_string(),
        e => e.to_string(),
    }
}

/// A simulated timetable's figures, and whether it fits the cap: by its peak in units, by
/// the simulator's peak in bytes, or by the memory model's whole-rank total.
pub(super) fn describe(
    (label, family, virtual_stages): (String, String, u32),
    tt: &Timetable,
    steady: &SteadyState,
    shape: &Shape,
    unit: Option<f64>,
    spec: &SearchSpec,
) -> Candidate {
    let sim = &steady.single;
    let peak = peak_units_kept(tt, &shape.weights, &shape.held, &shape.kept)
        .into_iter()
        .fold(0.0, f64::max);
    let peak_bytes = match (&spec.memory, spec.cap) {
        (Some(mem), MemoryCap::Bytes(_)) => whole::peak_total(mem, tt),
        _ => unit.map(|_| sim.report.peak_activation_bytes()),
    };
    let fits = match spec.cap {
        MemoryCap::Microbatches(x) => peak <= x + 1e-9,
        MemoryCap::Bytes(b) => peak_bytes.is_some_and(|pb| pb <= b),
    };
    Candidate {
        label,
        family,
        virtual_stages,
        makespan: sim.report.makespan,
        bubble_fraction: sim.report.bubble_fraction,
        period: steady.report.period,
        bubble: steady.report.bubble,
        peak_microbatches: peak,
        peak_bytes,
        fits,
        recomputes: recompute::count(tt).0,
    }
}

fn grouped(s: &ScheduleSpec) -> Option<u32> {
    (s.kind() == ScheduleKind::Interleaved1F1B && s.virtual_stages() > 1).then(|| s.group_size())
}
