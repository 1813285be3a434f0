//! `Timeline`: every event of a step, simulated or measured, and `chart`, the bubble chart of
//! several timelines stacked for comparison.

use pipewright_input::{read_timeline, timeline_from_text};
use pipewright_schedule::{chrome_trace, Timeline as RsTimeline};
use pyo3::prelude::*;

use crate::charts::{draw, Chart};
use crate::{err, to_py};

/// Every event of a step (device, action, start, end): simulated, or measured by a runtime
/// (pipewright's `train --trace`, or PyTorch's through `pipewright.torch`).
#[pyclass(module = "pipewright", frozen)]
#[derive(Clone)]
pub struct Timeline {
    pub(crate) inner: RsTimeline,
}

#[pymethods]
impl Timeline {
    /// A timeline from its JSON (what `simulate --timeline`, `train --trace` and
    /// `pipewright.torch`'s recorder write), checked as `pipewright viz --from` checks it
    /// (events inside its `meta`, no device computing two things at once, its compute a
    /// valid step) and within the size the CLI reads; errors call the text `json`.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        let inner = timeline_from_text("json", text).map_err(crate::input_err)?;
        Ok(Timeline { inner })
    }

    /// Read a timeline file, refused as `pipewright viz --from` refuses it (naming the file).
    #[staticmethod]
    fn read(path: std::path::PathBuf) -> PyResult<Self> {
        let inner = read_timeline(&path).map_err(crate::input_err)?;
        Ok(Timeline { inner })
    }

    /// The timeline as JSON (for `pipewright viz --from`).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner).map_err(err)
    }

    /// Write it as JSON to `path` (whole or not at all).
    fn write(&self, path: std::path::PathBuf) -> PyResult<()> {
        crate::timetable::write_atomic(&path, self.to_json()?.as_bytes())
    }

    /// A Chrome trace (Perfetto, chrome://tracing) of it, as JSON text.
    fn to_chrome_trace(&self) -> PyResult<String> {
        serde_json::to_string(&chrome_trace(&self.inner)).map_err(err)
    }

    /// What the timeline is of: schedule, devices, stages, microbatches, source, time unit.
    #[getter]
    fn meta(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.meta)
    }

    /// The events, as dicts (`device`, `action`, `start`, `end`).
    #[getter]
    fn events(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.events)
    }

    /// End of the last event.
    #[getter]
    fn makespan(&self) -> f64 {
        self.inner.makespan()
    }

    /// `1 - busy / (devices x span)`: the idle share of the step.
    #[getter]
    fn bubble_fraction(&self) -> f64 {
        self.inner.bubble_fraction()
    }

    /// Its bubble chart.
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Chart> {
        draw(&[(&self.inner, None)], format, width, height, title)
    }

    fn __len__(&self) -> usize {
        self.inner.events.len()
    }

    fn __repr__(&self) -> String {
        let m = &self.inner.meta;
        format!(
            "Timeline({:?}, devices={}, stages={}, microbatches={}, events={}, makespan={})",
            m.schedule,
            m.devices,
            m.stages,
            m.microbatches,
            self.inner.events.len(),
            self.inner.makespan()
        )
    }

    /// Shows as its bubble chart in a notebook.
    fn _repr_svg_(&self) -> PyResult<String> {
        self.chart("svg", 1200, None, None)?.svg_text()
    }
}

/// A bubble chart of several timelines stacked on one time axis, for comparison (a
/// simulated step above a measured one, say). `labels` name the panels.
#[pyfunction]
#[pyo3(signature = (timelines, labels = None, format = "svg", width = 1200, height = None, title = None))]
fn chart(
    timelines: Vec<PyRef<'_, Timeline>>,
    labels: Option<Vec<String>>,
    format: &str,
    #[pyo3(from_py_with = crate::args::whole)] width: u32,
    #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
    title: Option<String>,
) -> PyResult<Chart> {
    if let Some(l) = &labels {
        if l.len() != timelines.len() {
            return Err(err(format!(
                "{} labels for {} timelines: give one label per timeline",
                l.len(),
                timelines.len()
            )));
        }
    }
    let panels: Vec<(&RsTimeline, Option<String>)> = timelines
        .iter()
        .enumerate()
        .map(|(i, t)| (&t.inner, labels.as_ref().map(|l| l[i].clone())))
        .collect();
    draw(&panels, format, width, height, title)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Timeline>()?;
    m.add_function(wrap_pyfunction!(chart, m)?)?;
    Ok(())
}
