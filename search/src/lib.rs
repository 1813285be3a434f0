//! pipewright-search: the timetable that wins on the user's costs. [`search`] finds the fastest
//! under a memory cap, and [`sweep`] times chunk counts; both judge every candidate with
//! `pipewright-sim`'s simulator and generate nothing it cannot check.
//!
//! Invariants: no simulator of its own (every time is `pipewright-sim`'s), no candidate
//! trusted before it validates, no IO, no async, no search past its time budget.
//!
//! # Search
//!
//! The fastest timetable that fits a per-device memory cap, for the user's own costs.
//!
//! Candidates come from two sources. Every fixed family is tried over its shapes (chunks per
//! device `v`, interleaving group sizes). The search's own list scheduler ([`list_schedule`])
//! plays the step forward with the real costs and places F, I and W greedily under a cap; it
//! is run over placements, priorities and caps, and each of its timetables is judged by the
//! simulator like any other. Where a fixed family is over the cap and the costs say what a
//! recomputed microbatch keeps (its input), the family is tried again with the fewest `R`s
//! that bring each device under the cap (see `recompute`): only the microbatches alive at a
//! device's peak, each recomputed right before its backward, inside the bubble where that
//! backward waits. Every candidate is validated and simulated; none is trusted.
//!
//! The best is the fitting candidate with the smallest [`Objective`] (then the least memory,
//! then the first found, so a fixed family wins a tie). The objective is the steady-state
//! period by default ([`simulate_steps`](pipewright_sim::simulate::simulate_steps) over
//! [`PERIOD_STEPS`] steps: what unfenced training pays per step), or the single-step makespan
//! (steps fenced by a global barrier). Because the fixed families are candidates, the result
//! is never worse than the best of them that fits, under either objective. The Pareto front of
//! the objective against peak memory shows what more memory would buy.
//!
//! ```
//! use pipewright_search::{search, MemoryCap, SearchSpec};
//! use pipewright_sim::{CostModel, StageCost};
//!
//! // 4 devices, 8 microbatches, F=1 B=2 (W=1) per device's share; room for 4 microbatches.
//! let costs = CostModel::uniform(4, StageCost::new(1.0, 2.0, None)?);
//! let spec = SearchSpec::new(4, 8, costs, MemoryCap::Microbatches(4.0));
//! let found = search(&spec)?;
//! let best = &found.candidates[found.best];
//! assert!(best.fits && best.peak_microbatches <= 4.0);
//! // 1F1B fits (peak p = 4) with a bubble of 3/11; the search does better.
//! assert!(best.bubble_fraction < 3.0 / 11.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod budget;
mod evaluate;
mod found;
mod improve;
mod jobs;
mod list;
mod memory;
mod recompute;
mod request;
mod rounds;
mod runners;
pub mod sweep;
mod whole;

use std::time::Duration;

use serde::Serialize;

pub use budget::{CutShort, Progress, MAX_TIME_BUDGET};
pub use list::{list_schedule, Knobs};
pub use memory::{
    held_weights, kept_weights, parse_bytes, peak_units, peak_units_held, peak_units_kept,
    stage_weights, unit_bytes, BytesError, CapError, MemoryCap,
};
pub use request::{SearchRequest, SearchRequestError, MAX_RUNNERS_UP};
pub use rounds::{round_schedule, RoundKnobs};
pub use sweep::{
    best, parse_counts, sweep, CountsError, SweepGrid, SweepRequest, SweepRequestError, SweepRow,
};

use evaluate::{build, describe, evaluate_all, Best};
use found::{no_best, Found, Polish};
use improve::{improve, Improve};
use jobs::{fixed_label, jobs, list_placements, passage_need};
pub use list::fmt_units;
use pipewright_model::memory::{MemoryConfig, MemoryError};
use pipewright_model::shape::request::flag_form;
use pipewright_schedule::cancel::Cancel;
use pipewright_schedule::generators::generate;
use pipewright_schedule::spec::{Placement, ScheduleKind, ScheduleSpec};
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;
use pipewright_sim::simulate::{Bubbles, CostError, CostModel, Runtime, Simulation};
use runners::{refused, runners_up};

/// What to search.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchSpec {
    /// Pipeline devices `p`.
    pub devices: u32,
    /// Microbatches `m`.
    pub microbatches: u32,
    /// Costs along the model's depth (any stage count; cut or joined per candidate, see
    /// [`CostModel::resample`]).
    pub costs: CostModel,
    /// Per-device cap on stashed activations.
    pub cap: MemoryCap,
    /// Largest chunks per device `v` to try for the loop families and the list scheduler.
    pub max_virtual: u32,
    /// Fixed families to try.
    pub families: Vec<ScheduleKind>,
    /// Also run the search's own list scheduler.
    pub list_scheduler: bool,
    /// Most simulations spent improving the best timetable by moving work into its gaps.
    pub improve_budget: usize,
    /// What "fastest" means.
    pub objective: Objective,
    /// The whole rank's memory model: with a cap in bytes, a candidate fits when every
    /// device's predicted total (parameters, gradients, optimizer state, activations) is
    /// within it, and [`Candidate::peak_bytes`] is that total. `None`: the cap bounds the
    /// stashed activations alone, sized by the costs.
    pub memory: Option<MemoryConfig>,
    /// Stop evaluating candidates after this long (once one fits) and return the best found
    /// so far, saying so in [`SearchOutcome::cut_short`]; `None` evaluates them all.
    pub time_budget: Option<Duration>,
    /// Fitting candidates after the best whose timetables the outcome keeps, fastest first
    /// ([`SearchOutcome::runners_up`]): what a measured tuning step runs beside the best.
    pub runners_up: usize,
    /// Try timetables that split the backward (I then W). `false` for a runtime where I + W
    /// costs more than B and the costs do not say by how much (`--no-split-backward`).
    pub split_backward: bool,
    /// Set from another thread to stop as the time budget does (Ctrl-C in Python).
    pub cancel: Cancel,
}

/// What the search minimises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The steady-state period: time per step of unfenced training (the runtime's way).
    #[default]
    Period,
    /// The single-step makespan: time per step when a global barrier fences the steps.
    Makespan,
}

/// Steps the search simulates back to back to measure a candidate's period: a warm-up step,
/// then two whose start-to-start advance is the period. Every fixed family and list schedule
/// tried so far is periodic from the second step on (the tests check the winner against 12
/// steps), so more steps would cost time for the same figure.
pub const PERIOD_STEPS: u32 = 3;

impl Objective {
    /// The figure of `c` this objective minimises.
    pub fn of(self, c: &Candidate) -> f64 {
        match self {
            Objective::Period => c.period,
            Objective::Makespan => c.makespan,
        }
    }
}

impl std::str::FromStr for Objective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "period" => Ok(Objective::Period),
            "makespan" => Ok(Objective::Makespan),
            _ => Err(format!(
                "objective `{s}`: expected `period` (unfenced steps) or `makespan` (fenced steps)"
            )),
        }
    }
}

impl SearchSpec {
    /// Every family, `v` up to 4, and the list scheduler.
    pub fn new(devices: u32, microbatches: u32, costs: CostModel, cap: MemoryCap) -> Self {
        SearchSpec {
            devices,
            microbatches,
            costs,
            cap,
            max_virtual: 4,
            families: ScheduleKind::ALL.to_vec(),
            list_scheduler: true,
            improve_budget: 200,
            objective: Objective::Period,
            time_budget: None,
            memory: None,
            split_backward: true,
            runners_up: 4,
            cancel: Cancel::default(),
        }
    }
}

/// One evaluated timetable.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// What made it, e.g. `interleaved-1f1b v=2 g=4` or `list v=1 loop, I/W, cap 8`.
    pub label: String,
    /// Family name, or `list`.
    pub family: String,
    /// Chunks per device.
    pub virtual_stages: u32,
    /// Simulated step time of one step on its own.
    pub makespan: f64,
    /// `1 - ideal / makespan`.
    pub bubble_fraction: f64,
    /// Simulated steady-state period (time per step of unfenced steps).
    pub period: f64,
    /// Bubbles against the makespan, the period and the largest per-device span.
    pub bubble: Bubbles,
    /// Peak stashed activations of the fullest device, in microbatch units.
    pub peak_microbatches: f64,
    /// The same in bytes, when the costs carry activation sizes; with a memory model and a
    /// cap in bytes, the fullest device's predicted total (parameters, gradients, optimizer
    /// state and activations).
    pub peak_bytes: Option<u64>,
    /// Whether it fits the cap.
    pub fits: bool,
    /// `R` actions the search added because the cap forced them (0 for most candidates).
    pub recomputes: u32,
}

/// A shape that could not be tried, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skipped {
    /// What it would have been.
    pub label: String,
    /// Why not.
    pub reason: String,
}

/// What the search found.
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    /// The cap in microbatch units.
    pub cap_microbatches: f64,
    /// Bytes of one unit, when the costs carry activation sizes.
    pub unit_bytes: Option<f64>,
    /// Every evaluated candidate, in the order tried (fixed families with one shape per `v`
    /// first; see [`SearchSpec::time_budget`]).
    pub candidates: Vec<Candidate>,
    /// Shapes that could not run.
    pub skipped: Vec<Skipped>,
    /// Indices of the Pareto front (no candidate is both smaller and faster), by memory.
    pub front: Vec<usize>,
    /// Index of the best fitting candidate.
    pub best: usize,
    /// Index of the best fitting fixed-family candidate, if any fits.
    pub best_fixed: Option<usize>,
    /// The best timetable (compute actions only), validated.
    pub timetable: Checked,
    /// Its simulation (one step).
    pub simulation: Simulation,
    /// The objective it was chosen by.
    pub objective: Objective,
    /// Set when the time budget stopped the search early: the best is the best found so far.
    pub cut_short: Option<CutShort>,
    /// The next fitting candidates by the objective (index into `candidates`, and their
    /// timetable), at most [`SearchSpec::runners_up`], each timetable once.
    pub runners_up: Vec<(usize, Timetable)>,
}

/// Why the search has no answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SearchError {
    /// Zero devices or microbatches.
    #[error("the search needs at least one device and one microbatch (got p={p}, m={m})")]
    Empty {
        /// Devices.
        p: u32,
        /// Microbatches.
        m: u32,
    },
    /// A cap in bytes with no activation sizes (`activation_bytes`) to measure against.
    #[error("{}", self.named(cli_words))]
    NoActivationBytes,
    /// The costs do not fit.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// Candidates ran, but none fits.
    #[error("no schedule fits a cap of {cap} per device: the least any candidate needs is {least} microbatches ({label})")]
    NothingFits {
        /// The cap as given.
        cap: String,
        /// The smallest peak found, in units.
        least: String,
        /// The candidate that needs it.
        label: String,
    },
    /// Nothing could even be tried.
    #[error("no candidate could be built: {0}")]
    NoCandidates(String),
    /// The time budget ran out before any candidate that fits was found.
    #[error("the time budget of {budget_seconds} s ran out after {evaluated} of {total} candidates, none of which fits a cap of {cap} per device (raise the time budget, or the cap)")]
    OutOfTime {
        /// The budget, in seconds.
        budget_seconds: f64,
        /// Candidates evaluated.
        evaluated: usize,
        /// Candidates there were.
        total: usize,
        /// The cap as given.
        cap: String,
    },
    /// The memory model refuses the configuration.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// Parameters, gradients and optimizer state alone exceed a whole-rank byte cap.
    /// The levers it names are fields (`tp`, `zero`, `dp`; see [`SearchError::named`]).
    #[error("{}", self.named(cli_words))]
    StaticOverCap {
        /// The cap.
        cap: u64,
        /// Bytes of the fullest device before any activation.
        need: u64,
    },
}

/// A field as the command line writes it (`activation_bytes` is `--activation-bytes`).
fn cli_words(field: &str) -> String {
    flag_form(field, None)
}

impl SearchError {
    /// The message with each field written as `name` writes it (`--tp` on the command line,
    /// `tp` in Python); `Display` is the command line's.
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        match self {
            SearchError::NoActivationBytes => format!(
                "a memory cap in bytes needs activation sizes: give them ({}, or \"activation_bytes\" in the cost file) or give the cap in microbatches",
                name("activation_bytes")
            ),
            SearchError::StaticOverCap { cap, need } => format!(
                "a memory cap of {cap} bytes per rank leaves nothing for activations: parameters, gradients and optimizer state alone take {need} bytes on the fullest device (raise the cap, or shard more: {}, {} 1 with {}, more pipeline devices)",
                name("tp"),
                name("zero"),
                name("dp")
            ),
            e => e.to_string(),
        }
    }
}

/// A shape to evaluate.
#[derive(Clone, Copy, Debug)]
enum Job {
    Fixed(ScheduleSpec),
    List(Knobs),
    /// The zero-bubble paper's round heuristic (one chunk per device) under a cap in units.
    Rounds(RoundKnobs, f64),
    /// A fixed family over the cap, with the fewest recomputes that bring it under.
    Recompute(ScheduleSpec, f64),
}

impl Job {
    fn v(&self) -> u32 {
        match self {
            Job::Fixed(s) | Job::Recompute(s, _) => s.virtual_stages(),
            Job::List(k) => k.v,
            Job::Rounds(..) => 1,
        }
    }
}

/// Costs and stage weights for one chunk count.
struct Shape {
    costs: CostModel,
    weights: Vec<f64>,
    /// Units each stage still holds after its I until its W.
    held: Vec<f64>,
    /// Units a recomputed microbatch of each stage keeps until its R.
    kept: Vec<f64>,
}

impl Shape {
    fn weights(&self) -> recompute::Weights<'_> {
        recompute::Weights {
            weights: &self.weights,
            held: &self.held,
            kept: &self.kept,
        }
    }
}

/// Find the fastest timetable that fits `spec.cap`.
pub fn search(spec: &SearchSpec) -> Result<SearchOutcome, SearchError> {
    search_with(spec, &mut |_| {})
}

/// [`search`], reporting its [`Progress`] after every candidate.
pub fn search_with(
    spec: &SearchSpec,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<SearchOutcome, SearchError> {
    let deadline = budget::Deadline::after(spec.time_budget, &spec.cancel);
    let (p, m) = (spec.devices, spec.microbatches);
    if p == 0 || m == 0 {
        return Err(SearchError::Empty { p, m });
    }
    let per_device = spec.costs.resample(p)?;
    // Sums first: costs each finite but adding up past f64 would fail every candidate.
    per_device.check_totals(p, u64::from(m) * u64::from(PERIOD_STEPS))?;
    let (cap, unit) = cap_in_units(spec, &per_device)?;
    let shapes = shapes(spec);
    let (jobs, skipped) = jobs(spec, cap, &shapes);
    let (evaluated, best) = evaluate_all(&jobs, spec, &shapes, unit, deadline.clone(), on_progress);
    let cut_short = (evaluated.len() < jobs.len()).then(|| CutShort {
        budget_seconds: spec.time_budget.map_or(0.0, |b| b.as_secs_f64()),
        evaluated: evaluated.len(),
        total: jobs.len(),
    });
    let mut found = Found::collect(evaluated, &jobs, best.as_ref(), skipped, spec.objective);
    let (Some(mut best), Some(best_index)) = (best, found.best_index) else {
        return Err(no_best(spec, &found, cut_short, &shapes));
    };
    let polish = Polish {
        spec,
        shapes: &shapes,
        cap,
        unit,
        deadline,
    };
    let best_index = polish.improve(&mut best, &jobs, &mut found.candidates, best_index);
    let front = pareto_front(&found.candidates, spec.objective);
    let runners_up = runners_up(
        spec,
        &jobs,
        &shapes,
        &found.candidates,
        &found.made_by,
        &best,
    );
    Ok(SearchOutcome {
        cap_microbatches: cap,
        unit_bytes: unit,
        candidates: found.candidates,
        skipped: found.skipped,
        front,
        best: best_index,
        best_fixed: found.best_fixed,
        timetable: best.timetable,
        simulation: best.simulation,
        objective: spec.objective,
        cut_short,
        runners_up,
    })
}

/// The cap in microbatch units, and the bytes of one unit when known (from the costs'
/// activation sizes, or the memory model's whole-rank account under a cap in bytes).
fn cap_in_units(
    spec: &SearchSpec,
    per_device: &CostModel,
) -> Result<(f64, Option<f64>), SearchError> {
    let p = spec.devices;
    let unit = unit_bytes(per_device, p);
    Ok(match (spec.cap, &spec.memory) {
        (MemoryCap::Microbatches(x), _) => (x, unit),
        (MemoryCap::Bytes(b), Some(mem)) => {
            let (cap, bytes) = whole::units_cap(mem, p, b)?;
            (cap, Some(bytes))
        }
        (MemoryCap::Bytes(b), None) => {
            let unit = unit.ok_or(SearchError::NoActivationBytes)?;
            (b as f64 / unit, Some(unit))
        }
    })
}

/// Costs and stage weights per chunk count `v` (index `v`; 0 is one chunk too), `None`
/// where the costs cannot be cut to `p * v` stages.
fn shapes(spec: &SearchSpec) -> Vec<Option<Shape>> {
    let p = spec.devices;
    (0..=spec.max_virtual.max(2))
        .map(|v| {
            let costs = spec.costs.resample(p * v.max(1)).ok()?;
            let weights = stage_weights(&costs, p);
            let held = held_weights(&costs, &weights);
            let kept = kept_weights(&costs, &weights);
            Some(Shape {
                costs,
                weights,
                held,
                kept,
            })
        })
        .collect()
}

/// Order of preference: faster by the objective, then smaller.
fn key(c: &Candidate, objective: Objective) -> (Ordered, Ordered) {
    (Ordered(objective.of(c)), Ordered(c.peak_microbatches))
}

/// An `f64` ordered by `total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}
impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Indices of the candidates no other beats in both the objective and memory, by memory.
fn pareto_front(candidates: &[Candidate], objective: Objective) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        a.peak_microbatches
            .total_cmp(&b.peak_microbatches)
            .then(objective.of(a).total_cmp(&objective.of(b)))
    });
    let mut front = Vec::new();
    let mut fastest = f64::INFINITY;
    for i in order {
        let c = &candidates[i];
        let t = objective.of(c);
        if t < fastest * (1.0 - 1e-12) {
            // Peaks that differ only by rounding (thirds of a unit) are one memory level.
            if front.last().is_some_and(|&j: &usize| {
                candidates[j].peak_microbatches >= c.peak_microbatches - 1e-9
            }) {
                front.pop();
            }
            fastest = t;
            front.push(i);
        }
    }
    front
}
