//! `search` (the fastest timetable under a memory cap) and `sweep` (families over chunk
//! counts).

use pipewright_schedule::{Cancel, ScheduleKind};
use pipewright_search::sweep::{sweep_until, SweepRequest, SweepRequestError, SWEEP_STEPS};
use pipewright_search::SweepRow as RsRow;
use pipewright_search::{
    search as run_search, MemoryCap, SearchOutcome, SearchRequest, SearchRequestError,
    MAX_RUNNERS_UP,
};
use pipewright_viz::{pareto_plot, ChartOptions, ParetoPoint};
use pyo3::prelude::*;

use pipewright_input::{sweep_fits, timetable_fits};
use pipewright_schedule::RecomputePlan;

use crate::charts::{draw, image_format, Chart};
use crate::costs::Costs;
use crate::interrupt::interruptible;
use crate::results::{Bubbles, Candidate, CutShort, Skipped};
use crate::shape::{keyword, memory_request, memory_to_py, Shape};
use crate::simulate::Simulation;
use crate::timetable::Timetable;
use crate::{err, to_py};

/// A memory cap from a number of microbatches (`4`, `2.5`) or bytes with a unit (`"24GiB"`).
fn cap_of(cap: &Bound<'_, PyAny>) -> PyResult<MemoryCap> {
    let text = match cap.extract::<String>() {
        Ok(s) => s,
        Err(_) => cap.str()?.to_string(),
    };
    text.parse().map_err(err)
}

/// A request's error with its field as Python names it (`max_virtual`).
fn named(e: SearchRequestError) -> PyErr {
    err(e.named(costs_words))
}

/// A field as Python names it, where the costs' fields live in `Costs`, not in a keyword of
/// `search` or `sweep`: activation sizes are `Costs(activation_bytes=...)`, and a cost file is
/// `Costs.read(path)`.
fn costs_words(field: &str) -> String {
    match field {
        "activation_bytes" => "Costs(activation_bytes=...)".into(),
        "cost_file" => "Costs.read(path)".into(),
        f => f.to_string(),
    }
}

fn families(list: Option<Vec<String>>) -> PyResult<Vec<ScheduleKind>> {
    match list {
        None => Ok(ScheduleKind::ALL.to_vec()),
        Some(l) => l
            .iter()
            .map(|s| s.parse::<ScheduleKind>().map_err(err))
            .collect(),
    }
}

/// What `search` found: the best timetable, every candidate, the Pareto front.
#[pyclass(module = "pipewright", frozen)]
pub struct SearchResult {
    inner: SearchOutcome,
    /// The best timetable (compute actions only), named after the candidate that made it.
    #[pyo3(get)]
    timetable: Py<Timetable>,
    /// The best's one-step simulation.
    #[pyo3(get)]
    simulation: Py<Simulation>,
    /// Seconds the search took.
    #[pyo3(get)]
    seconds: f64,
    /// With a `shape`, each pipeline device's predicted memory under the best timetable
    /// (bytes by category and their `total`, as `search` prints it); else None.
    #[pyo3(get)]
    predicted_memory: Option<Py<PyAny>>,
}

impl SearchResult {
    /// The candidate at index `i` of the search's list.
    fn candidate(&self, i: usize) -> Candidate {
        Candidate {
            inner: self.inner.candidates[i].clone(),
        }
    }
}

#[pymethods]
impl SearchResult {
    /// The best candidate (label, family, period, makespan, bubbles, peak, fits, ...).
    #[getter]
    fn best(&self) -> Candidate {
        self.candidate(self.inner.best)
    }

    /// The best fixed-family candidate, if one fits the cap.
    #[getter]
    fn best_fixed(&self) -> Option<Candidate> {
        self.inner.best_fixed.map(|i| self.candidate(i))
    }

    /// Every evaluated candidate, in the order tried.
    #[getter]
    fn candidates(&self) -> Vec<Candidate> {
        (0..self.inner.candidates.len())
            .map(|i| self.candidate(i))
            .collect()
    }

    /// The Pareto front (no candidate both smaller and faster), by memory.
    #[getter]
    fn front(&self) -> Vec<Candidate> {
        self.inner
            .front
            .iter()
            .map(|&i| self.candidate(i))
            .collect()
    }

    /// Shapes that could not be tried, and why.
    #[getter]
    fn skipped(&self) -> Vec<Skipped> {
        let skipped = self.inner.skipped.iter().cloned();
        skipped.map(|inner| Skipped { inner }).collect()
    }

    /// Set when the time budget stopped the search early (budget, evaluated, total).
    #[getter]
    fn cut_short(&self) -> Option<CutShort> {
        self.inner.cut_short.clone().map(|inner| CutShort { inner })
    }

    /// The cap in microbatch units.
    #[getter]
    fn cap_microbatches(&self) -> f64 {
        self.inner.cap_microbatches
    }

    /// The best timetable and the next fitting ones, fastest first (up to `k` in all, at most
    /// 5), each named after its candidate: what `pipewright.torch.tune` runs to confirm the
    /// choice by measurement.
    #[pyo3(signature = (k = 5))]
    fn timetables(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::args::whole)] k: usize,
    ) -> PyResult<Vec<Py<Timetable>>> {
        if !(1..=5).contains(&k) {
            return Err(err(format!(
                "k {k}: give 1 to 5 (the best and up to 4 runners-up the search keeps)"
            )));
        }
        let mut out = vec![self.timetable.clone_ref(py)];
        for (i, tt) in self.inner.runners_up.iter().take(k.saturating_sub(1)) {
            let mut tt = tt.clone();
            tt.name = format!("search: {}", self.inner.candidates[*i].label);
            out.push(Py::new(py, Timetable::new(tt))?);
        }
        Ok(out)
    }

    /// The best timetable's simulated bubble chart.
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Chart> {
        let label = self.inner.candidates[self.inner.best].label.clone();
        draw(
            &[(&self.inner.simulation.timeline, Some(label))],
            format,
            width,
            height,
            title,
        )
    }

    /// The Pareto front of bubble against peak memory (what `search -o` draws).
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn pareto_chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Chart> {
        let found = &self.inner;
        let points = ParetoPoint::of_search(found);
        let fmt = image_format(format)?;
        let opts = ChartOptions {
            width,
            height,
            title,
            ..ChartOptions::default()
        };
        let bytes = pareto_plot(&points, Some(found.cap_microbatches), &opts, fmt).map_err(err)?;
        Ok(Chart::new(bytes, fmt))
    }

    fn __repr__(&self) -> String {
        let c = &self.inner.candidates[self.inner.best];
        format!(
            "SearchResult(best={:?}, period={}, makespan={}, candidates={})",
            c.label,
            c.period,
            c.makespan,
            self.inner.candidates.len()
        )
    }

    /// Shows as the best timetable's bubble chart in a notebook.
    fn _repr_svg_(&self) -> PyResult<String> {
        self.chart("svg", 1200, None, None)?.svg_text()
    }
}

/// Find the timetable with the smallest simulated step time on `p` devices with `m`
/// microbatches that fits `memory_cap` (microbatches of one device's share, or bytes with a
/// unit such as `"24GiB"`), among the fixed families and the search's own list scheduler.
/// With a `shape` (and the mesh beside it, the CLI's memory flags), a cap in bytes bounds
/// each rank's whole predicted memory, not its activations alone, and `predicted_memory`
/// gives the best's.
#[pyfunction]
#[pyo3(signature = (p, m, memory_cap, costs = None, max_virtual = 4, schedules = None, list_scheduler = true, improve = 200, objective = "period", time_budget = 30.0, *, split_backward = true, shape = None, tp = None, dp = None, zero = None, microbatch_size = None, sequence_parallel = false, precision = None, accounting = None, attention = None))]
#[allow(clippy::too_many_arguments)]
fn search(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::args::whole)] p: u32,
    #[pyo3(from_py_with = crate::args::whole)] m: u32,
    memory_cap: &Bound<'_, PyAny>,
    costs: Option<&Costs>,
    #[pyo3(from_py_with = crate::args::whole)] max_virtual: u32,
    schedules: Option<Vec<String>>,
    list_scheduler: bool,
    #[pyo3(from_py_with = crate::args::whole)] improve: usize,
    objective: &str,
    #[pyo3(from_py_with = crate::args::real)] time_budget: f64,
    split_backward: bool,
    shape: Option<&Shape>,
    #[pyo3(from_py_with = crate::args::opt_whole)] tp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] dp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] zero: Option<u8>,
    #[pyo3(from_py_with = crate::args::opt_whole)] microbatch_size: Option<u64>,
    sequence_parallel: bool,
    precision: Option<&str>,
    accounting: Option<&str>,
    attention: Option<&str>,
) -> PyResult<SearchResult> {
    let mut request = SearchRequest::new(p, m, cap_of(memory_cap)?);
    request.max_virtual = max_virtual;
    request.families = families(schedules)?;
    request.list_scheduler = list_scheduler;
    request.split_backward = split_backward;
    request.improve = improve;
    request.objective = objective.parse().map_err(err)?;
    request.time_budget = time_budget;
    // `timetables(k)` hands back the best and as many runners-up as a search keeps.
    request.runners_up = MAX_RUNNERS_UP;
    request.check().map_err(named)?;
    // Refused when this machine could not hold it, as the CLI's search.
    let (what, spm, times) = request.footprint();
    timetable_fits(&what, spm, times).map_err(err)?;
    let memory = memory_request(
        shape,
        tp,
        dp,
        zero,
        microbatch_size,
        sequence_parallel,
        precision,
        accounting,
        attention,
    )?;
    request.memory = memory
        .checked(p, 1, &RecomputePlan::default(), m)
        .map_err(|e| err(e.named(&keyword)))?;
    let spec = request
        .into_spec(Costs::or_default(costs)?.model(p, p)?)
        .map_err(named)?;
    let started = std::time::Instant::now();
    let cancel = spec.cancel.clone();
    let found = interruptible(py, &cancel, move || run_search(&spec))?
        .map_err(|e| err(e.named(costs_words)))?;
    let seconds = started.elapsed().as_secs_f64();
    let predicted = memory
        .predict(&found.timetable, &RecomputePlan::default())
        .map_err(|e| err(e.named(&keyword)))?;
    let mut tt = found.timetable.timetable().clone();
    tt.name = format!("search: {}", found.candidates[found.best].label);
    let sim = Simulation::new(py, found.simulation.clone(), predicted.as_deref())?;
    Ok(SearchResult {
        timetable: Py::new(py, Timetable::new(tt))?,
        simulation: Py::new(py, sim)?,
        predicted_memory: memory_to_py(py, predicted.as_deref())?,
        inner: found,
        seconds,
    })
}

/// One family at one (v, m) of a sweep; `error` says why it could not run.
#[pyclass(module = "pipewright", frozen, get_all)]
pub struct SweepRow {
    schedule: String,
    virtual_stages: u32,
    microbatches: u32,
    makespan: Option<f64>,
    bubble_fraction: Option<f64>,
    period: Option<f64>,
    throughput: Option<f64>,
    peak_activations: Option<u32>,
    peak_activation_bytes: Option<u64>,
    fits: Option<bool>,
    error: Option<String>,
    bubble: Option<Py<Bubbles>>,
}

impl SweepRow {
    fn new(py: Python<'_>, r: RsRow) -> PyResult<Self> {
        Ok(SweepRow {
            bubble: r
                .bubble
                .map(|inner| Py::new(py, Bubbles { inner }))
                .transpose()?,
            schedule: r.schedule,
            virtual_stages: r.virtual_stages,
            microbatches: r.microbatches,
            makespan: r.makespan,
            bubble_fraction: r.bubble_fraction,
            period: r.period,
            throughput: r.throughput,
            peak_activations: r.peak_activations,
            peak_activation_bytes: r.peak_activation_bytes,
            fits: r.fits,
            error: r.error,
        })
    }
}

#[pymethods]
impl SweepRow {
    /// The row as a dict (what `sweep --format json` gives per row): for `json.dumps` or
    /// `pandas.DataFrame([r.to_dict() for r in rows])`.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let row = RsRow {
            schedule: self.schedule.clone(),
            virtual_stages: self.virtual_stages,
            microbatches: self.microbatches,
            makespan: self.makespan,
            bubble_fraction: self.bubble_fraction,
            period: self.period,
            bubble: self.bubble.as_ref().map(|b| b.get().inner),
            throughput: self.throughput,
            peak_activations: self.peak_activations,
            peak_activation_bytes: self.peak_activation_bytes,
            fits: self.fits,
            error: self.error.clone(),
        };
        to_py(py, &row)
    }

    fn __repr__(&self) -> String {
        match &self.error {
            Some(e) => format!(
                "SweepRow({} v={} m={}: {e})",
                self.schedule, self.virtual_stages, self.microbatches
            ),
            None => format!(
                "SweepRow({} v={} m={}, makespan={:?}, bubble_fraction={:?}, period={:?})",
                self.schedule,
                self.virtual_stages,
                self.microbatches,
                self.makespan.unwrap_or(f64::NAN),
                self.bubble_fraction.unwrap_or(f64::NAN),
                self.period.unwrap_or(f64::NAN)
            ),
        }
    }
}

/// Simulate every family in `schedules` on `p` devices at each microbatch count in `m` and
/// chunk count in `v` (families with a fixed v run at it): bubble, period, throughput and
/// peak memory per row; `memory_cap` marks which fit, in `search`'s and the CLI's units
/// (microbatches of one device's share, `4`, or bytes with a unit, `"24GiB"`; both need
/// the costs' `activation_bytes`).
#[pyfunction]
#[pyo3(signature = (p = 4, m = vec![4, 8, 16, 32, 64], schedules = None, v = None, costs = None, memory_cap = None))]
fn sweep(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::args::whole)] p: u32,
    #[pyo3(from_py_with = crate::args::wholes)] m: Vec<u32>,
    schedules: Option<Vec<String>>,
    #[pyo3(from_py_with = crate::args::opt_wholes)] v: Option<Vec<u32>>,
    costs: Option<&Costs>,
    memory_cap: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<SweepRow>> {
    let request = SweepRequest {
        schedules: families(Some(schedules.unwrap_or_else(|| {
            ["gpipe", "1f1b", "interleaved-1f1b"]
                .map(String::from)
                .to_vec()
        })))?,
        p,
        v: v.unwrap_or_else(|| vec![2]),
        m,
        memory_cap: memory_cap.map(cap_of).transpose()?,
    };
    let named = |e: SweepRequestError| err(e.named(costs_words));
    request.check().map_err(named)?;
    let costs = Costs::or_default(costs)?;
    let cap_costs = match request.memory_cap {
        Some(_) => Some(costs.model(p, p)?),
        None => None,
    };
    let grid = request.into_grid(cap_costs.as_ref()).map_err(named)?;
    let sizes = grid.stage_microbatches();
    sweep_fits(&sizes, SWEEP_STEPS, "m=, v= or schedules=").map_err(err)?;
    let cancel = Cancel::default();
    let stop = cancel.clone();
    let rows = interruptible(py, &cancel, move || {
        sweep_until(
            &grid,
            |stages, devices| costs.resolve(stages, devices),
            &stop,
        )
    })?;
    rows.into_iter().map(|r| SweepRow::new(py, r)).collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SearchResult>()?;
    m.add_class::<SweepRow>()?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    Ok(())
}
