//! `plan`: the whole parallel configuration (TP, PP, DP, schedule, microbatches, recompute,
//! ZeRO, SP) for a GPT on a cluster, ranked by predicted step time.

use pipewright_input::{expect_kind, FileKind};
use pipewright_model::shape::{MoeKinds, Named, ShapeKinds};
use pipewright_plan::evaluate::timetable as family_timetable;
use pipewright_plan::launch::{launch, model_line, profile_launch, report_json, row_step};
use pipewright_plan::listed::configuration;
use pipewright_plan::request::parse_policy;
use pipewright_plan::{
    plan as run_plan, Cluster, Fixed, Plan as RsPlan, PlanModel, PlanRequest, RawPlanRequest,
};
use pipewright_schedule::{Cancel, RecomputePlan, ScheduleKind};
use pipewright_viz::{bubble_chart_with_memory, ChartOptions, ChartPanel, MemoryBars};
use pyo3::prelude::*;

use crate::charts::{image_format, Chart};
use crate::interrupt::interruptible;
use crate::results::PlanRow;
use crate::shape::{keyword, kind, kinds, named_text};
use crate::timetable::Timetable;
use crate::{err, read_file, to_py};

/// The text of the cluster file `arg` names, where it names no preset and the file exists
/// (as the CLI reads `--cluster`).
fn cluster_file(arg: &str) -> PyResult<Option<String>> {
    if Cluster::preset(arg).is_some() || !std::path::Path::new(arg).exists() {
        return Ok(None);
    }
    let text = read_file(std::path::Path::new(arg))?;
    expect_kind(arg, &text, FileKind::Cluster).map_err(crate::input_err)?;
    Ok(Some(text))
}

/// The ranked configurations; `best` is the first row, `timetable` its timetable.
#[pyclass(module = "pipewright", frozen)]
pub struct Plan {
    inner: RsPlan,
    request: PlanRequest,
    /// Seconds the plan took.
    #[pyo3(get)]
    seconds: f64,
    /// How a Hugging Face config was read (`note: hf_config=...` lines, the notes the CLI
    /// prints on stderr in its flags); empty otherwise.
    #[pyo3(get)]
    notes: Vec<String>,
}

#[pymethods]
impl Plan {
    /// Every ranked row, fastest first: its configuration, predicted step time, throughput,
    /// MFU, peak memory and headroom, bubble and the terms of its step.
    #[getter]
    fn rows(&self) -> Vec<PlanRow> {
        let rows = self.inner.rows.iter().cloned();
        rows.map(|inner| PlanRow { inner }).collect()
    }

    /// The best row, or None when nothing fits.
    #[getter]
    fn best(&self) -> Option<PlanRow> {
        let best = self.inner.rows.first().cloned();
        best.map(|inner| PlanRow { inner })
    }

    /// Why the best beat the runners-up, one line each, the dimensions written as keywords
    /// (`schedule=zbv v 2 instead of ...`).
    #[getter]
    fn explain(&self) -> Vec<String> {
        let lines = self.inner.explain.iter();
        lines.map(|l| l.named(&dimension)).collect()
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
                let mut tt = s.timetable.timetable().clone();
                tt.name = format!("plan: searched ({})", s.label);
                tt
            }
            None => family_timetable(&best.config, best.config.microbatches).map_err(err)?,
        };
        let mut out = Timetable::new(tt);
        out.recompute = RecomputePlan::uniform(best.config.recompute);
        Ok(Some(out))
    }

    /// The best configuration's simulated step (all its microbatches, in seconds) as a
    /// bubble chart with each pipeline device's predicted peak memory beside it: what
    /// `plan --chart` draws. None when nothing fits.
    #[pyo3(signature = (format = "svg", width = 1200, height = None, title = None))]
    fn chart(
        &self,
        format: &str,
        #[pyo3(from_py_with = crate::args::whole)] width: u32,
        #[pyo3(from_py_with = crate::args::opt_whole)] height: Option<u32>,
        title: Option<String>,
    ) -> PyResult<Option<Chart>> {
        let Some(best) = self.inner.rows.first() else {
            return Ok(None);
        };
        let fmt = image_format(format)?;
        let sim = row_step(&self.request, best).map_err(err)?;
        let panel = ChartPanel::new(&sim.timeline).with_label(configuration(best));
        let bars = MemoryBars {
            label: "predicted peak memory per pipeline device (its fullest GPU)".into(),
            devices: &best.memory,
        };
        let opts = ChartOptions {
            width,
            height,
            title,
            ..ChartOptions::default()
        };
        let bytes = bubble_chart_with_memory(&[panel], &[bars], &opts, fmt).map_err(err)?;
        Ok(Some(Chart::new(bytes, fmt)))
    }

    /// The whole plan as a dict: what `plan --format json` prints (the cluster, the model
    /// with its parameter count, every row, the search's counts, the launch).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(
            py,
            &report_json(&self.request, &self.inner, self.seconds, None),
        )
    }

    /// The model in one phrase, as the plan table's first line gives it (a GPT's sizes,
    /// kinds and parameters, or the profile's summary).
    #[getter]
    fn model(&self) -> String {
        model_line(&self.request)
    }

    /// A GPT's parameters, each counted once (None for a layer-list profile).
    #[getter]
    fn parameters(&self) -> Option<u64> {
        self.request.model.gpt().map(|s| s.parameters())
    }

    /// How to run the best, as the CLI prints it under "run the best:": `pipewright train`
    /// over NCCL for a GPT (a searched best's timetable as the file `timetable` names, where
    /// it is written; else `TIMETABLE.csv`), the user's own program for a layer-list model;
    /// None when nothing fits.
    #[pyo3(signature = (timetable = None))]
    fn launch(&self, timetable: Option<std::path::PathBuf>) -> Option<String> {
        let best = self.inner.rows.first()?;
        let file = timetable.map(|p| p.display().to_string());
        Some(match &self.request.model {
            PlanModel::Gpt(_) => launch(&self.request, best, file.as_deref()),
            PlanModel::Layers(p) => profile_launch(p, best).0,
        })
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
/// recomputation, ZeRO-1 and sequence parallelism for a GPT (its sizes and kinds, or a Hugging
/// Face config) or a layer-list model's profile on `gpus` GPUs of `cluster`: memory first,
/// then the simulator, ranked by predicted step time. Every keyword is `pipewright plan`'s
/// flag of the same name, checked by the same code (a mixture's and its expert layout's
/// refusals name the keywords: `top_k=`, `ep=`).
#[pyfunction]
#[pyo3(signature = (layers = None, d_model = None, heads = None, seq_len = None, gpus = None, global_batch = None, *, vocab = None, ffn = None, kv_heads = None, mlp = None, norm = None, tied_embeddings = false, positions = None, rope_theta = None, bias = None, experts = None, top_k = None, expert_ffn = None, shared_experts = None, shared_ffn = None, dense_layers = None, moe_every = None, expert_groups = None, groups_per_token = None, hf_config = None, profile = None, attention = None, cluster = "a100-80g", precision = "bf16", tp = None, pp = None, v = None, microbatch_size = None, schedule = None, recompute = None, zero = None, sequence_parallel = None, ep = None, etp = None, capacity_factor = 1.0, dispatcher = "all-to-all", fp8 = false, allow_cross_node_tp = false, top = 5, max_virtual = 8, max_microbatch_size = 16, max_simulated = 200, max_searched = 2))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::args::opt_whole)] layers: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] d_model: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] heads: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] seq_len: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] gpus: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] global_batch: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] vocab: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] ffn: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] kv_heads: Option<u32>,
    mlp: Option<&str>,
    norm: Option<&str>,
    tied_embeddings: bool,
    positions: Option<&str>,
    #[pyo3(from_py_with = crate::args::opt_real)] rope_theta: Option<f64>,
    bias: Option<&str>,
    #[pyo3(from_py_with = crate::args::opt_whole)] experts: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] top_k: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] expert_ffn: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] shared_experts: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] shared_ffn: Option<u64>,
    #[pyo3(from_py_with = crate::args::opt_whole)] dense_layers: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] moe_every: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] expert_groups: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] groups_per_token: Option<u32>,
    hf_config: Option<&Bound<'_, PyAny>>,
    profile: Option<&Bound<'_, PyAny>>,
    attention: Option<&str>,
    cluster: &str,
    precision: &str,
    #[pyo3(from_py_with = crate::args::opt_whole)] tp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] pp: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] v: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] microbatch_size: Option<u64>,
    schedule: Option<&str>,
    recompute: Option<&str>,
    #[pyo3(from_py_with = crate::args::opt_whole)] zero: Option<u8>,
    sequence_parallel: Option<bool>,
    #[pyo3(from_py_with = crate::args::opt_whole)] ep: Option<u32>,
    #[pyo3(from_py_with = crate::args::opt_whole)] etp: Option<u32>,
    #[pyo3(from_py_with = crate::args::real)] capacity_factor: f64,
    dispatcher: &str,
    fp8: bool,
    allow_cross_node_tp: bool,
    #[pyo3(from_py_with = crate::args::whole)] top: usize,
    #[pyo3(from_py_with = crate::args::whole)] max_virtual: u32,
    #[pyo3(from_py_with = crate::args::whole)] max_microbatch_size: u64,
    #[pyo3(from_py_with = crate::args::whole)] max_simulated: usize,
    #[pyo3(from_py_with = crate::args::whole)] max_searched: usize,
) -> PyResult<Plan> {
    let mut moe = MoeKinds::default();
    (moe.experts, moe.top_k, moe.expert_ffn) = (experts, top_k, expert_ffn);
    (moe.shared_experts, moe.shared_ffn) = (shared_experts, shared_ffn);
    (moe.dense_layers, moe.every) = (dense_layers, moe_every);
    (moe.expert_groups, moe.groups_per_token) = (expert_groups, groups_per_token);
    let words = (mlp, norm, positions, bias);
    let kinds = kinds((ffn, kv_heads, rope_theta), words, tied_embeddings)?;
    let mut raw = RawPlanRequest::default();
    let shape = &mut raw.shape;
    (shape.layers, shape.d_model, shape.heads) = (layers, d_model, heads);
    (shape.seq_len, shape.vocab) = (seq_len, vocab);
    shape.kinds = ShapeKinds { moe, ..kinds };
    shape.hf_config = named_file(hf_config, "config", FileKind::HfConfig)?;
    raw.profile = named_file(profile, "profile", FileKind::LayerProfile)?;
    (raw.gpus, raw.global_batch) = (gpus, global_batch);
    (raw.cluster, raw.cluster_file) = (cluster.to_string(), cluster_file(cluster)?);
    (raw.precision, raw.attention) = (precision.parse().map_err(err)?, kind(attention)?);
    let dims = (tp, pp, v, microbatch_size, zero);
    let fixed = fixed(dims, (schedule, recompute), sequence_parallel)?;
    raw.fixed = Fixed { ep, etp, ..fixed };
    (raw.capacity_factor, raw.fp8) = (capacity_factor, fp8);
    raw.dispatcher = dispatcher
        .parse()
        .map_err(|e| err(format!("dispatcher: {e}")))?;
    (raw.allow_cross_node_tp, raw.top) = (allow_cross_node_tp, top);
    (raw.max_virtual, raw.max_microbatch_size) = (max_virtual, max_microbatch_size);
    (raw.max_simulated, raw.max_searched) = (max_simulated, max_searched);
    planned(py, raw)
}

/// A dimension of `explain` as a keyword, `schedule=zbv v 2` or `sequence_parallel=`: a
/// dimension named without its value is not a switch turned on (which [`keyword`] writes
/// `sequence_parallel=True`).
fn dimension(field: &str, value: Option<String>) -> String {
    format!("{field}={}", value.unwrap_or_default())
}

/// An optional file argument's name and text (see [`named_text`]).
fn named_file(
    arg: Option<&Bound<'_, PyAny>>,
    what: &str,
    kind: FileKind,
) -> PyResult<Option<Named>> {
    arg.map(|a| named_text(a, what, kind)).transpose()
}

/// The fixed sizes as given: TP, PP, v, the microbatch size and the ZeRO level.
type FixedSizes = (
    Option<u32>,
    Option<u32>,
    Option<u32>,
    Option<u64>,
    Option<u8>,
);

/// The fixed dimensions: sizes as given, the schedule and policy read.
fn fixed(
    (tp, pp, v, microbatch_size, zero): FixedSizes,
    (schedule, recompute): (Option<&str>, Option<&str>),
    sequence_parallel: Option<bool>,
) -> PyResult<Fixed> {
    Ok(Fixed {
        tp,
        pp,
        v,
        microbatch_size,
        schedule: schedule
            .map(|s| s.parse::<ScheduleKind>())
            .transpose()
            .map_err(err)?,
        recompute: recompute
            .map(parse_policy)
            .transpose()
            .map_err(|e| err(format!("recompute: {e}")))?,
        zero,
        sequence_parallel,
        ..Fixed::default()
    })
}

/// Build the request and plan it, interruptibly.
fn planned(py: Python<'_>, raw: RawPlanRequest) -> PyResult<Plan> {
    let (request, notes) = raw.build().map_err(|e| err(e.named(&keyword)))?;
    let started = std::time::Instant::now();
    // Ctrl-C returns at once; the planner, which has no stop flag of its own, ends in the
    // background within its simulation budget (`max_simulated`).
    let asked = request.clone();
    let inner = interruptible(py, &Cancel::default(), move || {
        run_plan(&asked, &mut |_| {})
    })?
    .map_err(|e| err(e.named(&keyword)))?;
    Ok(Plan {
        inner,
        request,
        seconds: started.elapsed().as_secs_f64(),
        notes: notes.iter().map(|n| n.named(&keyword)).collect(),
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Plan>()?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    Ok(())
}
