//! `Costs`: what the simulator charges, as the CLI's cost flags give it.

use pipewright_input::{expect_kind, FileKind};
use pipewright_sim::simulate::{
    measured_costs_with, CostError, CostOptions, CostSource, HostCosts,
};
use pipewright_sim::{CostModel, RawCostFile};
use pyo3::prelude::*;

use crate::timeline::Timeline;
use crate::{byte_count, check_counts, err, json_text, read_file, to_py};

/// Durations, sizes and link speed for the simulator: uniform per device (`Costs(f, b)`), or
/// per stage from a cost file (`Costs.read(path)`, `Costs.from_json(text)`), or measured
/// from recorded timelines (`Costs.from_timelines([...])`).
#[pyclass(module = "pipewright", frozen)]
#[derive(Clone)]
pub struct Costs {
    /// Uniform costs, or a cost file's text (resolved once the stage count is known).
    base: Base,
    p2p_latency: Option<f64>,
    bandwidth: Option<f64>,
    w_memory: Option<f64>,
}

#[derive(Clone)]
enum Base {
    Uniform(CostOptions),
    File { text: String, name: String },
}

impl Costs {
    /// The cost model for a timetable of `stages` stages over `devices` devices.
    pub(crate) fn model(&self, stages: u32, devices: u32) -> PyResult<CostModel> {
        self.resolve(stages, devices).map_err(err)
    }

    /// The same, with the error as the library's words.
    pub(crate) fn resolve(&self, stages: u32, devices: u32) -> Result<CostModel, String> {
        let source = match &self.base {
            Base::Uniform(o) => o.source.clone(),
            Base::File { text, name } => CostSource::Model(
                CostModel::from_json(text, stages).map_err(|e| format!("{name}: {e}"))?,
            ),
        };
        let options = CostOptions {
            source,
            p2p_latency: self.p2p_latency,
            bandwidth: self.bandwidth,
            w_memory: self.w_memory,
        };
        options.model(stages, devices).map_err(cost_words)
    }

    /// The given costs, or the CLI's default `--cost 1,2`.
    pub(crate) fn or_default(costs: Option<&Costs>) -> PyResult<Costs> {
        match costs {
            Some(c) => Ok(c.clone()),
            None => Costs::new(1.0, 2.0, None, None, None, None, None, None),
        }
    }

    /// Costs from a cost file's text, checked now at the file's own stage count (its
    /// per-stage list is fitted to a timetable's stages when one is simulated).
    fn file(text: String, name: String) -> PyResult<Self> {
        // A timetable or a timeline given as costs is named for what it is, as `--cost-file`.
        expect_kind(&name, &text, FileKind::CostFile).map_err(crate::input_err)?;
        let listed = serde_json::from_str::<RawCostFile>(&text)
            .ok()
            .and_then(|raw| raw.stages.map(|s| s.len()))
            .unwrap_or(1)
            .max(1);
        let stages = u32::try_from(listed).map_err(err)?;
        CostModel::from_json(&text, stages).map_err(|e| err(format!("{name}: {e}")))?;
        Ok(Costs {
            base: Base::File { text, name },
            p2p_latency: None,
            bandwidth: None,
            w_memory: None,
        })
    }
}

#[pymethods]
impl Costs {
    /// Uniform costs of one device's share of the model per microbatch: forward `f`, full
    /// backward `b` and its weight part `w` (default b/2); with v chunks per device each
    /// costs 1/v. `activation_bytes` are stashed per microbatch, `p2p_bytes` cross each
    /// stage boundary (both bytes, or with a unit as the CLI's flags: `"1MiB"`); `p2p_latency` and `bandwidth` (bytes per cost unit, default infinite)
    /// time the transfers; `w_memory` is the fraction of activations held from I until W.
    #[new]
    #[pyo3(signature = (f = 1.0, b = 2.0, w = None, activation_bytes = None, p2p_bytes = None, p2p_latency = None, bandwidth = None, w_memory = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = crate::args::real)] f: f64,
        #[pyo3(from_py_with = crate::args::real)] b: f64,
        #[pyo3(from_py_with = crate::args::opt_real)] w: Option<f64>,
        activation_bytes: Option<&Bound<'_, PyAny>>,
        p2p_bytes: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::args::opt_real)] p2p_latency: Option<f64>,
        #[pyo3(from_py_with = crate::args::opt_real)] bandwidth: Option<f64>,
        #[pyo3(from_py_with = crate::args::opt_real)] w_memory: Option<f64>,
    ) -> PyResult<Self> {
        let options = CostOptions::uniform(
            f,
            b,
            w,
            activation_bytes.map_or(Ok(0), |b| byte_count(b, "activation_bytes"))?,
            p2p_bytes.map_or(Ok(0), |b| byte_count(b, "p2p_bytes"))?,
        )
        .map_err(|e| err(cost_words(e)))?;
        let costs = Costs {
            base: Base::Uniform(options),
            p2p_latency,
            bandwidth,
            w_memory,
        };
        // Refuse bad overrides now, not at the first simulation.
        costs.model(1, 1)?;
        Ok(costs)
    }

    /// A cost file's costs (`--cost-file`): `{"default": {"f":..,"b":..}, "stages": [...],
    /// "p2p_latency":.., "bandwidth":..}`.
    #[staticmethod]
    fn from_json(text: String) -> PyResult<Self> {
        Costs::file(text, "costs".into())
    }

    /// Read a cost file (as `--cost-file` does).
    #[staticmethod]
    fn read(path: std::path::PathBuf) -> PyResult<Self> {
        let name = path.display().to_string();
        let text = read_file(&path)?;
        Costs::file(text, name)
    }

    /// Per-stage costs measured in recorded timelines (the median over them), and the
    /// hand-off latency between devices (`p2p_latency`, the median wait a consumer showed), as
    /// `train --costs-out` writes them: what `search` needs to fit a timetable to a real run.
    /// `probe`: steps of the same stages with the backward split (for `i` and `w` beside a
    /// fused `b`); `host`: the host time measured beside them, a dict as the cost file's
    /// `host` (`{"runtime": "pytorch", "action": .., "send": .., "recv": .., "other": ..}`).
    #[staticmethod]
    #[pyo3(signature = (timelines, probe = None, host = None))]
    fn from_timelines(
        timelines: Vec<PyRef<'_, Timeline>>,
        probe: Option<Vec<PyRef<'_, Timeline>>>,
        host: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let tls: Vec<&pipewright_schedule::Timeline> = timelines.iter().map(|t| &t.inner).collect();
        // Medians over steps of different pipelines would be no pipeline's costs.
        pipewright_schedule::same_pipeline(&tls).map_err(|e| err(format!("timelines: {e}")))?;
        let probe = probe.unwrap_or_default();
        let probed: Vec<&pipewright_schedule::Timeline> = probe.iter().map(|t| &t.inner).collect();
        pipewright_schedule::same_pipeline(&probed).map_err(|e| err(format!("probe: {e}")))?;
        let host = host
            .map(|h| -> PyResult<HostCosts> {
                serde_json::from_str(&json_text(h)?).map_err(|e| err(format!("host: {e}")))
            })
            .transpose()?;
        let raw = measured_costs_with(&tls, &probed, host).map_err(err)?;
        Costs::file(
            serde_json::to_string_pretty(&raw).map_err(err)?,
            "measured costs".into(),
        )
    }

    /// The same costs with other link or held-for-W figures.
    #[pyo3(signature = (p2p_latency = None, bandwidth = None, w_memory = None))]
    fn with_overrides(
        &self,
        #[pyo3(from_py_with = crate::args::opt_real)] p2p_latency: Option<f64>,
        #[pyo3(from_py_with = crate::args::opt_real)] bandwidth: Option<f64>,
        #[pyo3(from_py_with = crate::args::opt_real)] w_memory: Option<f64>,
    ) -> PyResult<Self> {
        let costs = Costs {
            p2p_latency: p2p_latency.or(self.p2p_latency),
            bandwidth: bandwidth.or(self.bandwidth),
            w_memory: w_memory.or(self.w_memory),
            ..self.clone()
        };
        if let Base::Uniform(_) = costs.base {
            costs.model(1, 1)?;
        }
        Ok(costs)
    }

    /// The resolved per-stage model for `stages` stages over `devices` devices, as a dict.
    fn model_dict(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::args::whole)] stages: u32,
        #[pyo3(from_py_with = crate::args::whole)] devices: u32,
    ) -> PyResult<Py<PyAny>> {
        check_counts(("stages", stages), ("devices", devices))?;
        to_py(py, &self.model(stages, devices)?)
    }

    /// A cost file's text for these costs (`search --cost-file`, `simulate --cost-file`);
    /// uniform costs are written for `stages` stages over `devices` devices.
    #[pyo3(signature = (stages = None, devices = None))]
    fn to_json(
        &self,
        #[pyo3(from_py_with = crate::args::opt_whole)] stages: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] devices: Option<u32>,
    ) -> PyResult<String> {
        match (&self.base, stages) {
            (Base::File { text, .. }, None) => Ok(text.clone()),
            (_, Some(s)) => {
                check_counts(("stages", s), ("devices", devices.unwrap_or(s)))?;
                let model = self.model(s, devices.unwrap_or(s))?;
                Ok(serde_json::to_string_pretty(&model).map_err(err)? + "\n")
            }
            (Base::Uniform(_), None) => Err(err(
                "to_json of uniform costs needs stages= (and devices=): they are split per stage",
            )),
        }
    }

    fn __repr__(&self) -> String {
        match &self.base {
            Base::Uniform(o) => match &o.source {
                CostSource::Uniform(c) => format!("Costs(f={}, b={}, w={})", c.f, c.b, c.w),
                CostSource::Model(_) => "Costs(model)".into(),
            },
            Base::File { name, .. } => format!("Costs.read({name:?})"),
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Costs>()
}

/// A cost error in Python's words: uniform costs are `Costs(f, b, w)` (the CLI's `--cost`),
/// other fields their keywords (`w_memory`).
fn cost_words(e: CostError) -> String {
    e.named(|field| match field {
        "cost" => "Costs".to_string(),
        f => f.to_string(),
    })
}
