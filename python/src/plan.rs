//! `plan`: the whole parallel configuration (TP, PP, DP, schedule, microbatches, recompute,
//! ZeRO, SP) for a GPT on a cluster, ranked by predicted step time.

use pipewright_schedule::memory::ModelShape;
use pipewright_schedule::plan::evaluate::timetable as family_timetable;
use pipewright_schedule::plan::{plan as run_plan, Cluster, Fixed, Plan as RsPlan, PlanRequest};
use pipewright_schedule::{Recompute, ScheduleKind};
use pyo3::prelude::*;

use crate::timetable::Timetable;
use crate::{err, read_file, to_py};

/// A preset name (`a100-80g`, `h100-80g`) or a cluster JSON file, as `--cluster` takes it.
fn cluster(arg: &str) -> PyResult<Cluster> {
    if let Some(c) = Cluster::preset(arg) {
        return Ok(c);
    }
    if !std::path::Path::new(arg).exists() {
        return Err(err(format!(
            "--cluster {arg}: neither a preset ({}) nor a file",
            Cluster::PRESETS.join(", ")
        )));
    }
    Cluster::from_json(&read_file(arg)?).map_err(|e| err(format!("--cluster {arg}: {e}")))
}

/// The ranked configurations; `best` is the first row, `timetable` its timetable.
#[pyclass(module = "pipewright", frozen)]
pub struct Plan {
    inner: RsPlan,
    /// Seconds the plan took.
    #[pyo3(get)]
    seconds: f64,
}

#[pymethods]
impl Plan {
    /// Every ranked row, fastest first: its configuration, predicted step time, throughput,
    /// MFU, peak memory and headroom, bubble and the terms of its step.
    #[getter]
    fn rows(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.rows)
    }

    /// The best row, or None when nothing fits.
    #[getter]
    fn best(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.rows.first())
    }

    /// Why the best beat the runners-up, one line each.
    #[getter]
    fn explain(&self) -> Vec<String> {
        self.inner.explain.clone()
    }

    /// Whether the simulation budget ran out before every bound was beaten.
    #[getter]
    fn cut_short(&self) -> bool {
        self.inner.cut_short
    }

    /// The best row's timetable: its searched one, or its family's (with its recomputation
    /// as `R` actions, which PyTorch's CSV forms refuse: use activation checkpointing there).
    #[getter]
    fn timetable(&self) -> PyResult<Option<Timetable>> {
        let Some(best) = self.inner.rows.first() else {
            return Ok(None);
        };
        let tt = match &best.searched {
            Some(s) => {
                let mut tt = s.timetable.clone();
                tt.name = format!("plan: searched ({})", s.label);
                tt
            }
            None => family_timetable(&best.config, best.config.microbatches).map_err(err)?,
        };
        Ok(Some(Timetable::new(tt)))
    }

    /// The whole plan as a dict (what `plan --format json` holds about the rows).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner)
    }

    fn __len__(&self) -> usize {
        self.inner.rows.len()
    }

    fn __repr__(&self) -> String {
        match self.inner.rows.first() {
            Some(b) => format!(
                "Plan(rows={}, best: tp={} pp={} dp={} {} v={} m={} step {:.4} s)",
                self.inner.rows.len(),
                b.config.tp,
                b.config.pp,
                b.config.dp,
                b.config.schedule,
                b.config.v,
                b.config.microbatches,
                b.step_time_s
            ),
            None => "Plan(rows=0)".into(),
        }
    }
}

/// Choose TP, PP, DP, the schedule and its chunks, the microbatch size and count,
/// recomputation, ZeRO-1 and sequence parallelism for a GPT on `gpus` GPUs of `cluster`:
/// memory first, then the simulator, ranked by predicted step time. Keyword arguments fix a
/// dimension (`tp=2`, `schedule="zbv"`) as `pipewright plan`'s flags do.
#[pyfunction]
#[pyo3(signature = (layers, d_model, heads, seq_len, gpus, global_batch, *, vocab = 51200, ffn = None, cluster = "a100-80g", precision = "bf16", tp = None, pp = None, v = None, microbatch_size = None, schedule = None, recompute = None, zero = None, sequence_parallel = None, allow_cross_node_tp = false, top = 5, max_virtual = 8, max_microbatch_size = 16, max_simulated = 200, max_searched = 2))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    layers: u32,
    d_model: u64,
    heads: u32,
    seq_len: u64,
    gpus: u32,
    global_batch: u64,
    vocab: u64,
    ffn: Option<u64>,
    cluster: &str,
    precision: &str,
    tp: Option<u32>,
    pp: Option<u32>,
    v: Option<u32>,
    microbatch_size: Option<u64>,
    schedule: Option<&str>,
    recompute: Option<&str>,
    zero: Option<u8>,
    sequence_parallel: Option<bool>,
    allow_cross_node_tp: bool,
    top: usize,
    max_virtual: u32,
    max_microbatch_size: u64,
    max_simulated: usize,
    max_searched: usize,
) -> PyResult<Plan> {
    for (name, value) in [
        ("layers", u64::from(layers)),
        ("d_model", d_model),
        ("heads", u64::from(heads)),
        ("seq_len", seq_len),
        ("vocab", vocab),
        ("gpus", u64::from(gpus)),
        ("global_batch", global_batch),
        ("top", top as u64),
        ("max_virtual", u64::from(max_virtual)),
        ("max_microbatch_size", max_microbatch_size),
    ] {
        if value == 0 {
            return Err(err(format!("{name} must be at least 1")));
        }
    }
    if !d_model.is_multiple_of(u64::from(heads)) {
        return Err(err(format!(
            "heads {heads} does not divide d_model {d_model}: each head needs a whole share of the width"
        )));
    }
    if zero.is_some_and(|z| z > 1) {
        return Err(err(
            "zero: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)",
        ));
    }
    let shape = ModelShape::gpt(
        layers,
        d_model,
        heads,
        ffn.unwrap_or(4 * d_model),
        seq_len,
        vocab,
    );
    let mut req = PlanRequest::new(shape, self::cluster(cluster)?, gpus, global_batch);
    req.precision = precision.parse().map_err(err)?;
    req.fixed = Fixed {
        tp,
        pp,
        v,
        microbatch_size,
        schedule: schedule
            .map(|s| s.parse::<ScheduleKind>())
            .transpose()
            .map_err(err)?,
        recompute: recompute
            .map(|r| r.parse::<Recompute>())
            .transpose()
            .map_err(err)?,
        zero,
        sequence_parallel,
    };
    req.allow_cross_node_tp = allow_cross_node_tp;
    req.top = top;
    req.max_virtual = max_virtual;
    req.max_microbatch_size = max_microbatch_size;
    req.max_simulated = max_simulated.max(1);
    req.max_searched = max_searched;
    let started = std::time::Instant::now();
    let inner = py.detach(|| run_plan(&req, &mut |_| {})).map_err(err)?;
    Ok(Plan {
        inner,
        seconds: started.elapsed().as_secs_f64(),
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Plan>()?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    Ok(())
}
