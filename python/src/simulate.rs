//! `simulate` (one step or K unfenced steps), `Timeline`, `Report`, `Simulation`.

use pipewright_schedule::Checked;
use pipewright_sim::simulate::{check_steps, SimError, SimulateRequest, Simulated, SteadyState};
use pipewright_sim::{Report as RsReport, Simulation as RsSim};
use pyo3::prelude::*;

use pipewright_input::steps_fit;
use pipewright_model::memory::MemoryBreakdown;

use crate::charts::{draw, Chart};
use crate::costs::Costs;
use crate::results::{Bubbles, DeviceReport};
use crate::shape::{keyword, memory_request, memory_to_py, Shape};
pub use crate::timeline::Timeline;
use crate::timetable::Timetable;
use crate::{err, to_py};

/// Makespan, ideal, bubbles and peak memory of one simulated step.
#[pyclass(module = "pipewright", frozen)]
pub struct Report {
    inner: RsReport,
}

#[pymethods]
impl Report {
    /// Step time.
    #[getter]
    fn makespan(&self) -> f64 {
        self.inner.makespan
    }

    /// Compute time of the busiest device.
    #[getter]
    fn ideal(&self) -> f64 {
        self.inner.ideal
    }

    /// `1 - ideal / makespan`.
    #[getter]
    fn bubble_fraction(&self) -> f64 {
        self.inner.bubble_fraction
    }

    /// Per device: busy time, bubble, peak in-flight activations (count and bytes).
    #[getter]
    fn devices(&self) -> Vec<DeviceReport> {
        let devices = self.inner.devices.iter().cloned();
        devices.map(|inner| DeviceReport { inner }).collect()
    }

    /// The whole report as a dict (what `simulate --format json` prints).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "Report(makespan={}, ideal={}, bubble_fraction={:.4})",
            self.inner.makespan, self.inner.ideal, self.inner.bubble_fraction
        )
    }
}

/// A simulated step: its `timeline` and its `report`; shows as a bubble chart.
#[pyclass(module = "pipewright", frozen)]
pub struct Simulation {
    /// Every event.
    #[pyo3(get)]
    timeline: Py<Timeline>,
    /// The figures.
    #[pyo3(get)]
    report: Py<Report>,
    /// With a `shape`, each pipeline device's predicted memory (bytes by category and their
    /// `total`, what `simulate --format json` gives as `predicted_memory`); else None.
    #[pyo3(get)]
    predicted_memory: Option<Py<PyAny>>,
}

impl Simulation {
    pub(crate) fn new(
        py: Python<'_>,
        s: RsSim,
        memory: Option<&[MemoryBreakdown]>,
    ) -> PyResult<Self> {
        Ok(Simulation {
            timeline: Py::new(py, Timeline { inner: s.timeline })?,
            report: Py::new(py, Report { inner: s.report })?,
            predicted_memory: memory_to_py(py, memory)?,
        })
    }
}

#[pymethods]
impl Simulation {
    /// The step's bubble chart as an image (`format="svg"` or `"png"`).
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Chart> {
        let tl = &self.timeline.get().inner;
        draw(&[(tl, None)], format, width, height, title)
    }

    fn __repr__(&self) -> String {
        self.report
            .get()
            .__repr__()
            .replacen("Report", "Simulation", 1)
    }

    /// Shows as its bubble chart in a notebook.
    fn _repr_svg_(&self) -> PyResult<String> {
        self.chart("svg", 1200, None, None)?.svg_text()
    }
}

/// K steps simulated back to back, unfenced as training runs: each device starts its next
/// step after its own last action. `period` is the steady-state time per step.
#[pyclass(module = "pipewright", frozen)]
pub struct SteadySimulation {
    inner: SteadyState,
    /// All K steps on one time axis.
    #[pyo3(get)]
    timeline: Py<Timeline>,
    /// The first step on its own.
    #[pyo3(get)]
    single: Py<Simulation>,
    /// With a `shape`, each pipeline device's predicted memory (as `Simulation`'s).
    #[pyo3(get)]
    predicted_memory: Option<Py<PyAny>>,
}

#[pymethods]
impl SteadySimulation {
    /// Steps simulated, K.
    #[getter]
    fn steps(&self) -> u32 {
        self.inner.report.steps
    }

    /// Steady-state time per step.
    #[getter]
    fn period(&self) -> f64 {
        self.inner.report.period
    }

    /// One step's makespan on its own.
    #[getter]
    fn single_step_makespan(&self) -> f64 {
        self.inner.report.single_step_makespan
    }

    /// Makespan of each of the K steps.
    #[getter]
    fn step_makespans(&self) -> Vec<f64> {
        self.inner.report.step_makespans.clone()
    }

    /// The bubble against the makespan (`single_step`), the period (`steady_state`) and
    /// the largest per-device span (`largest_span`).
    #[getter]
    fn bubble(&self) -> Bubbles {
        Bubbles {
            inner: self.inner.report.bubble,
        }
    }

    /// The whole steady-state report as a dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.report)
    }

    /// The K steps' bubble chart.
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Chart> {
        draw(
            &[(&self.inner.timeline, None)],
            format,
            width,
            height,
            title,
        )
    }

    fn __repr__(&self) -> String {
        let r = &self.inner.report;
        format!(
            "SteadySimulation(steps={}, period={}, single_step_makespan={}, steady_state_bubble={:.4})",
            r.steps, r.period, r.single_step_makespan, r.bubble.steady_state
        )
    }

    /// Shows as its bubble chart in a notebook.
    fn _repr_svg_(&self) -> PyResult<String> {
        self.chart("svg", 1200, None, None)?.svg_text()
    }
}

/// Simulate a timetable with real durations: one step (`steps=1`, a `Simulation`), or K
/// steps back to back, unfenced (`steps=K`, a `SteadySimulation`). Costs default to
/// `Costs(1, 2)`. With a `shape` (and the mesh beside it: `tp`, `dp`, `zero`,
/// `microbatch_size`, `sequence_parallel`, `precision`, `accounting`, `attention`, the
/// CLI's memory flags), the memory model predicts each device's memory
/// (`predicted_memory`).
#[pyfunction]
#[pyo3(signature = (timetable, costs = None, steps = 1, *, shape = None, tp = None, dp = None, zero = None, microbatch_size = None, sequence_parallel = false, precision = None, accounting = None, attention = None))]
#[allow(clippy::too_many_arguments)]
fn simulate(
    py: Python<'_>,
    timetable: &Timetable,
    costs: Option<&Costs>,
    #[pyo3(from_py_with = crate::args::whole)] steps: u32,
    shape: Option<&Shape>,
    #[pyo3(from_py_with = crate::args::opt_whole)] tp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] dp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] zero: Option<u8>,
    #[pyo3(from_py_with = crate::args::opt_whole)] microbatch_size: Option<u64>,
    sequence_parallel: bool,
    precision: Option<&str>,
    accounting: Option<&str>,
    attention: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let tt = &timetable.inner;
    check_steps(steps).map_err(|e| err(e.named("steps")))?;
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
    )?
    .predict(tt, &timetable.recompute)
    .map_err(|e| err(e.named(&keyword)))?;
    let model = Costs::or_default(costs)?.model(tt.num_stages(), tt.num_devices())?;
    if steps > 1 {
        steps_fit(tt, steps).map_err(err)?;
    }
    // Validated once, in the simulator's words; it takes the timetable as checked.
    let tt = Checked::new(tt.clone()).map_err(|e| err(SimError::from(e)))?;
    // The request the CLI's `simulate` builds too: it decides one step or K.
    let request = SimulateRequest::new(&tt, &model, steps).map_err(|e| err(e.named("steps")))?;
    let s = match py.detach(|| request.run()).map_err(err)? {
        Simulated::One(s) => {
            return Ok(Py::new(py, Simulation::new(py, s, memory.as_deref())?)?.into_any())
        }
        Simulated::Steady(s) => *s,
    };
    let single = Simulation::new(py, s.single.clone(), memory.as_deref())?;
    let steady = SteadySimulation {
        timeline: Py::new(
            py,
            Timeline {
                inner: s.timeline.clone(),
            },
        )?,
        single: Py::new(py, single)?,
        predicted_memory: memory_to_py(py, memory.as_deref())?,
        inner: s,
    };
    Ok(Py::new(py, steady)?.into_any())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Report>()?;
    m.add_class::<Simulation>()?;
    m.add_class::<SteadySimulation>()?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    Ok(())
}
