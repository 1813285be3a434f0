//! `plan`: the whole parallel configuration for a model on a cluster, ranked and explained,
//! and the best as a launch command.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pipewright::schedule::memory::AttentionKind;
use pipewright::schedule::plan::explain::seconds;
use pipewright::schedule::plan::launch::{
    launch, profile_launch, report_json, row_step, searched_note,
};
use pipewright::schedule::plan::listed::configuration;
use pipewright::schedule::plan::request::{cluster_of, parse_policy, Built};
use pipewright::schedule::plan::{
    plan, Cluster, Dispatcher, Fixed, Plan, PlanRequest, PlanRow, Precision, Progress,
    RawPlanRequest,
};
use pipewright::schedule::shape::request::flag_form;
use pipewright::schedule::shape::{Named, ShapeRequest};
use pipewright::schedule::{Recompute, ScheduleKind};
use pipewright::viz::{
    bubble_chart_with_memory, ChartOptions, ChartPanel, ImageFormat, MemoryBars,
};

use super::args::Device;
use super::checks::{Kind, Output};
use super::commands::ReportFormat;
use super::console;
use super::io::{read_text, FileKind};
use super::outputs::{Input, Outputs};
use super::plan_searched;
use super::plan_table::{heading, launch_note, row_line};
use super::shape::{parse_attention, ShapeArgs};
use super::timetable_out::CommsArg;

/// Choose TP, PP, DP, the schedule and its chunks, the microbatch size and count,
/// recomputation, ZeRO-1 and sequence parallelism for a GPT (or, with `--profile`, a
/// layer-list model as profiled) on a cluster: memory first, then the simulator, ranked by
/// predicted step time.
#[derive(Args, Debug)]
pub struct PlanCmd {
    /// Plan a layer-list model from its profile (JSON, from
    /// `pipewright::runtime::split::layer_profile`; see `examples/custom_mlp.rs`) instead of
    /// a GPT: its measured times, parameters and bytes per layer. tp is the profile's (the
    /// degree its layers were measured at, 1 unless it says), recompute none or full, the global batch is in samples, and microbatches are of the profile's size
    /// unless `--microbatch-size` is given (times and activations then scale linearly).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["layers", "d_model", "heads", "ffn", "kv_heads", "mlp", "norm", "tied_embeddings", "positions", "rope_theta", "bias", "experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "dense_layers", "moe_every", "expert_groups", "groups_per_token", "fp8", "hf_config", "attention", "seq_len", "vocab", "tp", "sequence_parallel", "validate", "calibrate", "timetable_out"]
    )]
    profile: Option<PathBuf>,
    /// Plan the model of a Hugging Face config.json (llama, mistral, qwen2, gpt2, gpt_neox,
    /// and the mixtures mixtral, qwen2_moe, qwen3_moe, deepseek_v3): its layers, widths,
    /// heads and key/value heads, MLP, norm, embeddings and vocabulary, its experts and
    /// their routing, and DeepSeek's latent attention;
    /// the sequence is the context it was pretrained at unless --seq-len says otherwise.
    /// The table's first line gives its parameter count.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["layers", "d_model", "heads", "ffn", "kv_heads", "mlp", "norm", "tied_embeddings", "positions", "rope_theta", "bias", "vocab"]
    )]
    hf_config: Option<PathBuf>,
    /// Transformer blocks.
    #[arg(long, value_name = "L", required_unless_present_any = ["calibrate", "profile", "hf_config"])]
    layers: Option<u32>,
    /// Width of the residual stream (h).
    #[arg(long, value_name = "H", required_unless_present_any = ["calibrate", "profile", "hf_config"])]
    d_model: Option<u64>,
    /// Attention heads (query heads).
    #[arg(long, value_name = "A", required_unless_present_any = ["calibrate", "profile", "hf_config"])]
    heads: Option<u32>,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Tokens per sequence (with --hf-config: instead of the config's).
    #[arg(long, value_name = "S", required_unless_present_any = ["calibrate", "profile", "hf_config"])]
    seq_len: Option<u64>,
    /// Vocabulary size [default: 51200].
    #[arg(long, value_name = "V")]
    vocab: Option<u64>,
    /// How the run computes attention: fused (FlashAttention: no s x s scores in memory;
    /// selective recomputation then rebuilds the norms' and the MLP activation's outputs) or
    /// materialized (the scores written out; selective recomputation drops them, as
    /// Korthikanti et al. 2022) [default: the cluster's: fused on h100-80g, materialized on
    /// a100-80g].
    #[arg(long, value_name = "KIND", value_parser = parse_attention)]
    attention: Option<AttentionKind>,
    /// GPUs to use, all of them (tp * pp * dp = N).
    #[arg(long, value_name = "N", required_unless_present = "calibrate")]
    gpus: Option<u32>,
    /// `a100-80g`, `h100-80g`, or a cluster JSON file (see plan/src/cluster.rs).
    #[arg(long, default_value = "a100-80g", value_name = "NAME|FILE")]
    cluster: String,
    /// Sequences (with `--profile`, samples) per training step.
    #[arg(long, value_name = "SEQUENCES", required_unless_present = "calibrate")]
    global_batch: Option<u64>,
    /// Number format of the run: bf16 (mixed precision), tf32 or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_precision)]
    precision: Precision,
    /// Fix the tensor-parallel size.
    #[arg(long)]
    tp: Option<u32>,
    /// Fix the pipeline-parallel size.
    #[arg(long)]
    pp: Option<u32>,
    /// Fix the model chunks per pipeline device.
    #[arg(long)]
    v: Option<u32>,
    /// Fix the sequences per microbatch.
    #[arg(long, value_name = "B")]
    microbatch_size: Option<u64>,
    /// Fix the schedule family (gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2,
    /// zbv, dualpipev).
    #[arg(long, value_name = "NAME", value_parser = parse_schedule)]
    schedule: Option<ScheduleKind>,
    /// Fix the recomputation of every stage: none, selective, full.
    #[arg(long, value_name = "POLICY", value_parser = parse_policy)]
    recompute: Option<Recompute>,
    /// Fix the ZeRO level (0 or 1).
    #[arg(long, value_name = "LEVEL", value_parser = clap::value_parser!(u8).range(0..=1))]
    zero: Option<u8>,
    /// Fix sequence parallelism on.
    #[arg(long, conflicts_with = "no_sequence_parallel")]
    sequence_parallel: bool,
    /// Fix sequence parallelism off.
    #[arg(long)]
    no_sequence_parallel: bool,
    /// Fix expert parallelism of a mixture of experts (folded over each stage's tp x dp
    /// GPUs; it divides the routed experts).
    #[arg(long)]
    ep: Option<u32>,
    /// Fix expert tensor parallelism of a mixture of experts [default: 1].
    #[arg(long)]
    etp: Option<u32>,
    /// A mixture's capacity factor: tokens an expert rank receives over the even share, in
    /// memory and time (1: even routing).
    #[arg(long, default_value_t = 1.0, value_name = "X")]
    capacity_factor: f64,
    /// How a mixture's tokens reach their experts: `all-to-all` (a copy for each expert on
    /// another GPU, as pipewright's runtime and Megatron-Core's alltoall dispatcher) or
    /// `deepep` (DeepEP: a token crosses to each other node holding its experts once).
    #[arg(long, default_value = "all-to-all", value_name = "NAME", value_parser = parse_dispatcher)]
    dispatcher: Dispatcher,
    /// Time the linear layers' GEMMs (projections, MLPs, experts) in FP8 at the cluster's
    /// FP8 peak, with their quantization passes, as DeepSeek-V3 and Transformer Engine run
    /// them (attention's core, the router and the LM head stay bf16; under --dispatcher
    /// deepep the dispatch moves FP8). Memory is planned as in bf16, and MFU is still
    /// counted against the bf16 peak.
    #[arg(long)]
    fp8: bool,
    /// Let a TP group span nodes (over the inter-node link).
    #[arg(long)]
    allow_cross_node_tp: bool,
    /// Rows of the ranking to show.
    #[arg(long, default_value_t = 5, value_name = "N")]
    top: usize,
    /// Largest chunks per device tried (interleaved-1f1b, looped-bfs).
    #[arg(long, default_value_t = 8, value_name = "V")]
    max_virtual: u32,
    /// Largest microbatch size tried.
    #[arg(long, default_value_t = 16, value_name = "B")]
    max_microbatch_size: u64,
    /// Most configurations simulated (the rest ranked out by their lower bounds).
    #[arg(long, default_value_t = 200, value_name = "N")]
    max_simulated: usize,
    /// Shapes of the ranking (tp, pp, dp, microbatch size and count) whose timetable is also
    /// searched with `search`'s list scheduler under the cluster's memory, where pp x m is at
    /// most 256; a searched timetable that beats the shape's best family is a row of its own.
    /// 0 searches none.
    #[arg(long, default_value_t = 2, value_name = "K")]
    max_searched: usize,
    /// Write the best's timetable to FILE.csv (PyTorch's compute-only form; with --comms its
    /// compute+comms form) or FILE.json when it is a searched one; the launch line then runs
    /// it with `train --timetable FILE`. Not with `--profile`, whose rows are generator
    /// families only.
    #[arg(long, value_name = "FILE")]
    timetable_out: Option<PathBuf>,
    /// Write the best configuration's predicted costs (seconds per stage: F, B, I, W, the
    /// all-to-all inside them, hand-offs) as a cost file, so `simulate --cost-file`, `search
    /// --cost-file` and `viz` time the plan's costs as measured ones. Memory stays the plan's
    /// (`--memory`): the file gives no activation bytes, so `search` caps in microbatches.
    #[arg(long, value_name = "FILE")]
    costs_out: Option<PathBuf>,
    #[command(flatten)]
    comms: CommsArg,
    /// Say why the best beat the runners-up (which terms of the step differ).
    #[arg(long)]
    explain: bool,
    /// `json` prints everything: every row, its memory per device, its terms.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Print the best configuration's predicted memory per pipeline device, by category.
    #[arg(long)]
    memory: bool,
    /// Draw the best configuration's simulated step (all its microbatches) as a bubble chart
    /// to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// Measure this machine instead of planning: matmul rates over shapes (fitted to the
    /// efficiency curve), memory bandwidth and the in-process hand-off, written as a cluster
    /// file for `--cluster FILE` (the CPU; one in-process device per core). It plans nothing,
    /// so it takes no model, batch or planning flag.
    #[arg(long, value_name = "FILE")]
    calibrate: Option<PathBuf>,
    /// What `--calibrate` measures: `cpu`, or `cuda` / `cuda:N` in a build with `--features
    /// cuda` (its matmul rates per precision, HBM bandwidth and memory; NVLink and InfiniBand
    /// are taken from `--cluster`'s preset).
    #[arg(long, requires = "calibrate", default_value = "cpu", value_parser = super::args::parse_device)]
    device: Device,
    /// Train K of the simulated configurations in-process (the best, the slowest, and between
    /// them spread by predicted time; the reference GPT, through `train`) and print measured
    /// against predicted step time with their rank correlation, and predicted against
    /// measured peak memory. Use a model small enough for this machine and a cluster of it
    /// (`--calibrate`).
    #[arg(long, value_name = "K")]
    validate: Option<usize>,
}

fn parse_precision(s: &str) -> std::result::Result<Precision, String> {
    s.parse()
}

fn parse_schedule(s: &str) -> std::result::Result<ScheduleKind, String> {
    s.parse()
        .map_err(|e: pipewright::schedule::SpecError| e.to_string())
}

impl PlanCmd {
    /// `--calibrate` plans nothing: refuse a model, batch or planning flag beside it (a
    /// `--hf-config` named as its output was overwritten, every planning flag ignored). Checked
    /// here rather than by clap's conflicts, which would lift `--device`'s `requires`.
    fn calibrates_only(&self) -> Result<()> {
        let given = [
            ("--profile", self.profile.is_some()),
            ("--hf-config", self.hf_config.is_some()),
            ("--layers", self.layers.is_some()),
            ("--d-model", self.d_model.is_some()),
            ("--heads", self.heads.is_some()),
            ("--seq-len", self.seq_len.is_some()),
            ("--vocab", self.vocab.is_some()),
            ("--gpus", self.gpus.is_some()),
            ("--global-batch", self.global_batch.is_some()),
            ("--tp", self.tp.is_some()),
            ("--pp", self.pp.is_some()),
            ("--v", self.v.is_some()),
            ("--microbatch-size", self.microbatch_size.is_some()),
            ("--schedule", self.schedule.is_some()),
            ("--recompute", self.recompute.is_some()),
            ("--zero", self.zero.is_some()),
            ("--ep", self.ep.is_some()),
            ("--etp", self.etp.is_some()),
            ("--timetable-out", self.timetable_out.is_some()),
            ("--costs-out", self.costs_out.is_some()),
            ("--chart", self.chart.is_some()),
            ("--validate", self.validate.is_some()),
            ("--fp8", self.fp8),
        ];
        // The shape's kinds (--experts, --expert-groups, ...) plan a model too.
        let kinds = self.shape.kinds();
        let kind = kinds.given().first().map(|f| flag_form(f, None));
        let given = given.iter().find(|(_, g)| *g).map(|(f, _)| f.to_string());
        match given.or(kind) {
            Some(flag) => bail!(
                "--calibrate measures this machine and plans nothing: {flag} does not apply \
                 (calibrate first, then plan with --cluster FILE)"
            ),
            None => Ok(()),
        }
    }

    pub fn run(&self) -> Result<()> {
        let cluster_file = Input::maybe_file("--cluster", &self.cluster);
        if let Some(path) = &self.calibrate {
            self.calibrates_only()?;
            let outs = Outputs::plan(
                [
                    cluster_file,
                    Input::new("--profile", self.profile.as_ref()),
                    Input::new("--hf-config", self.hf_config.as_ref()),
                ],
                [Output::new("--calibrate", Some(path), Kind::Json)],
            )?;
            return super::calibrate::run(outs, self.device, &cluster(&self.cluster)?);
        }
        let mut outs = Outputs::plan(
            [
                cluster_file,
                Input::new("--profile", self.profile.as_ref()),
                Input::new("--hf-config", self.hf_config.as_ref()),
            ],
            [
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new(
                    "--timetable-out",
                    self.timetable_out.as_ref(),
                    Kind::Timetable,
                ),
                Output::new("--costs-out", self.costs_out.as_ref(), Kind::Json),
            ],
        )?;
        let (req, notes) = self.request()?;
        self.comms.check(
            self.timetable_out
                .as_deref()
                .map(|p| ("--timetable-out", p)),
        )?;
        let (plan, seconds) = planned(&req)?;
        // A searched best's timetable text first: what PyTorch cannot run is refused before
        // any output.
        let tt_text = match (&self.timetable_out, plan.rows.first()) {
            (Some(path), Some(best)) => Some((path, plan_searched::text(best, path, self.comms)?)),
            _ => None,
        };
        let text = match self.format {
            ReportFormat::Json => json(&req, &plan, seconds, self.timetable_out.as_ref())?,
            ReportFormat::Table => self.table(&req, &plan, seconds),
        };
        if let (Some(path), Some(best)) = (&self.chart, plan.rows.first()) {
            outs.stage("--chart", &chart(&req, best, path)?)?;
        }
        if let (Some(_), Some(best)) = (&self.costs_out, plan.rows.first()) {
            let file = pipewright::plan::costs::costs_file(&req, &best.config);
            outs.stage("--costs-out", &serde_json::to_vec_pretty(&file)?)?;
        }
        if let Some((path, text)) = tt_text {
            match text {
                Some(text) => outs.stage("--timetable-out", text.as_bytes())?,
                None => console::note(&format!(
                    "--timetable-out {}: not written, the best is a generator family (--schedule names it)",
                    path.display()
                )),
            }
        }
        outs.commit()?;
        console::print(&text)?;
        for note in notes {
            console::note(&note.to_string());
        }
        if let Some(k) = self.validate {
            let fit = super::validate_plan::fitting(&req, &plan.simulated)?;
            let runs = super::validate_plan::spread(&fit, k);
            console::print(&super::validate_plan::validate(&req, &runs)?)?;
        }
        Ok(())
    }

    /// The request, and notes on how a config.json was read: the flags as the library's
    /// raw request (files read here), built and checked there.
    fn request(&self) -> Result<Built> {
        // Each named for what it is when it is another kind of file.
        let named = |p: &PathBuf, want: FileKind| -> Result<Named> {
            let (name, text) = (p.display().to_string(), read_text(p)?);
            pipewright::input::expect_kind(&name, &text, want)?;
            Ok(Named { name, text })
        };
        let raw = RawPlanRequest {
            shape: ShapeRequest {
                layers: self.layers,
                d_model: self.d_model,
                heads: self.heads,
                seq_len: self.seq_len,
                vocab: self.vocab,
                kinds: self.shape.kinds(),
                hf_config: self
                    .hf_config
                    .as_ref()
                    .map(|p| named(p, FileKind::HfConfig))
                    .transpose()?,
            },
            profile: self
                .profile
                .as_ref()
                .map(|p| named(p, FileKind::LayerProfile))
                .transpose()?,
            gpus: self.gpus,
            global_batch: self.global_batch,
            cluster: self.cluster.clone(),
            cluster_file: cluster_file(&self.cluster)?,
            precision: self.precision,
            attention: self.attention,
            fixed: Fixed {
                tp: self.tp,
                pp: self.pp,
                v: self.v,
                microbatch_size: self.microbatch_size,
                schedule: self.schedule,
                recompute: self.recompute,
                zero: self.zero,
                sequence_parallel: match (self.sequence_parallel, self.no_sequence_parallel) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                ep: self.ep,
                etp: self.etp,
            },
            allow_cross_node_tp: self.allow_cross_node_tp,
            top: self.top,
            max_virtual: self.max_virtual,
            max_microbatch_size: self.max_microbatch_size,
            max_simulated: self.max_simulated,
            max_searched: self.max_searched,
            capacity_factor: self.capacity_factor,
            dispatcher: self.dispatcher,
            fp8: self.fp8,
        };
        let (mut req, notes) = raw.build()?;
        if let Some(k) = self.validate {
            if k < 2 {
                bail!("--validate needs at least 2 configurations to rank (got {k})");
            }
            // Simulate well past the top rows, so the spread reaches slower configurations.
            req.top = req.top.max(4 * k);
        }
        Ok((req, notes))
    }

    fn table(&self, req: &PlanRequest, plan: &Plan, seconds: f64) -> String {
        let mut out = heading(req, plan, seconds);
        out += if req.model.tokens(1.0).is_some() {
            "  #  step s   tokens/s  TFLOP/s/GPU   MFU  peak GiB  headroom  bubble  limit     configuration\n"
        } else {
            "  #  step s  samples/s  TFLOP/s/GPU   MFU  peak GiB  headroom  bubble  limit     configuration\n"
        };
        for (i, r) in plan.rows.iter().take(self.top).enumerate() {
            out += &row_line(req, i, r);
        }
        if let Some(best) = plan.rows.first() {
            if self.explain {
                out += &explain(best, plan);
            }
            if self.memory {
                out += &memory_table(best);
            }
            match req.model.profile() {
                None => {
                    let file = self.timetable_out.as_ref().map(|p| p.display().to_string());
                    let file = file.as_deref();
                    out += &format!("\nrun the best:\n  {}\n", launch(req, best, file));
                    out += &launch_note(req, &best.config);
                    out += &searched_note(best, file).unwrap_or_default();
                }
                Some(p) => out += &format!("\nrun the best:\n{}", profile_launch(p, best).0),
            }
        }
        out
    }
}

/// The best's predicted peak per pipeline device, by category, in GiB.
fn memory_table(best: &PlanRow) -> String {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let mut out = String::from(
        "\nmemory of the best, per pipeline device (GiB):\n  device  parameters  gradients  optimizer  activations  buffers  workspace   total\n",
    );
    for (d, m) in best.memory.iter().enumerate() {
        out += &format!(
            "  {d:>6}  {:>10.2}  {:>9.2}  {:>9.2}  {:>11.2}  {:>7.2}  {:>9.2}  {:>6.2}\n",
            gib(m.parameters),
            gib(m.gradients),
            gib(m.optimizer_state),
            gib(m.activations),
            gib(m.buffers),
            gib(m.workspace),
            gib(m.total())
        );
    }
    out
}

/// The best's one step, every microbatch, as a bubble chart, with its predicted peak memory
/// per pipeline device by category under it: the image's bytes.
fn chart(req: &PlanRequest, best: &PlanRow, path: &Path) -> Result<Vec<u8>> {
    let fmt = ImageFormat::from_path(path)?;
    let sim = row_step(req, best).map_err(|e| anyhow!("{e}"))?;
    let panel = ChartPanel::new(&sim.timeline).with_label(configuration(best));
    let bars = MemoryBars {
        label: "predicted peak memory per pipeline device (its fullest GPU)".into(),
        devices: &best.memory,
    };
    let opts = ChartOptions::default();
    Ok(bubble_chart_with_memory(&[panel], &[bars], &opts, fmt)?)
}

fn bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) =
        ProgressStyle::with_template("plan {bar:30} {pos}/{len} bounded  {elapsed_precise}  {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// The text of the cluster file `arg` names, where it names no preset and the file exists.
fn cluster_file(arg: &str) -> Result<Option<String>> {
    let path = Path::new(arg);
    if Cluster::preset(arg).is_some() || !path.exists() {
        return Ok(None);
    }
    let text = read_text(path)?;
    pipewright::input::expect_kind(arg, &text, FileKind::Cluster)?;
    Ok(Some(text))
}

/// A preset name or a cluster file.
fn cluster(arg: &str) -> Result<Cluster> {
    Ok(cluster_of(arg, cluster_file(arg)?.as_deref())?)
}

fn explain(best: &PlanRow, plan: &Plan) -> String {
    let mut out = String::from("\nwhy the best:\n");
    if let Some(t) = best.terms {
        let x = |v: f64| seconds(v, best.step_time_s, false);
        out += &format!(
            "  its step: compute {}, recompute {}, TP comm {}, PP comm {}, DP comm {}, optimizer {}, bubble {}\n",
            x(t.compute),
            x(t.recompute),
            x(t.tp_comm),
            x(t.pp_comm),
            x(t.dp_comm),
            x(t.optimizer),
            x(t.bubble)
        );
        if t.ep_comm > 0.0 {
            // A mixture's step: the all-to-all its schedule leaves exposed.
            out.insert_str(out.len() - 1, &format!(", EP comm {}", x(t.ep_comm)));
        }
    }
    for line in &plan.explain {
        out += &format!("  {line}\n");
    }
    out
}

fn parse_dispatcher(s: &str) -> Result<Dispatcher, String> {
    s.parse()
}

fn json(
    req: &PlanRequest,
    plan: &Plan,
    seconds: f64,
    timetable: Option<&PathBuf>,
) -> Result<String> {
    let file = timetable.map(|p| p.display().to_string());
    let value = report_json(req, plan, seconds, file.as_deref());
    Ok(serde_json::to_string_pretty(&value)? + "\n")
}

/// Plan `req` under a progress bar (drawn after a second); the plan and its seconds.
fn planned(req: &PlanRequest) -> Result<(Plan, f64)> {
    let started = Instant::now();
    let bar = bar();
    let mut show = |p: &Progress| {
        if started.elapsed() > Duration::from_secs(1) {
            bar.set_length(p.candidates as u64);
            bar.set_position(p.bounded as u64);
            bar.set_message(format!(
                "{} memory-checked, {} simulated",
                p.memory_checked, p.simulated
            ));
        }
    };
    let result = plan(req, &mut show);
    bar.finish_and_clear();
    let plan = result.map_err(|e| anyhow!("{e}"))?;
    Ok((plan, started.elapsed().as_secs_f64()))
}
