//! `train` (the reference GPT over in-process devices) and `bench` (synthetic stages of exact
//! durations, measured against the simulator).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pipewright::runtime::{
    train_gpt, FinalParams, Mesh, RuntimeError, StepRecord, StepReport, TrainConfig, TrainRequest,
    TrainRequestError, Zero,
};
use pipewright::schedule::shape::request::flag_form;
use pipewright::schedule::{Checked, Timeline, Timetable};
use pipewright::viz::{
    bubble_chart_with_memory, ChartOptions, ChartPanel, ImageFormat, MemoryBars,
};

use super::args::{
    mpi_universe, nccl_universe, parse_device, Device, MpiUniverse, PrecisionArg, SourceArgs,
    Transport,
};
use super::checks::{Kind, Output};
use super::commands::ReportFormat;
use super::console::{self, Lines};
use super::measured;
use super::outputs::Outputs;
use super::progress::{oversubscribed, warn_oversubscribed, StepLog};
use super::search::stage_measured_costs;
use super::shape::ShapeArgs;
use super::steady::{period_line, MeasuredPeriod};
use pipewright::schedule::memory::{
    moe::ExpertLayout, Accounting, MemPrecision, MemoryConfig, ModelShape,
};

/// Train the reference GPT on in-process devices (one thread per rank), or one process per
/// rank over MPI (`mpirun -np <pp*tp*dp> pipewright train --transport mpi ...`), or one
/// process per GPU over NCCL (`mpirun -np <pp*tp*dp> pipewright train --transport nccl ...`).
#[derive(Args, Debug)]
pub struct TrainCmd {
    #[command(flatten)]
    source: SourceArgs,
    /// `local`: every rank a thread of this process; `mpi`: this process is one rank of an
    /// MPI world of pp*tp*dp processes (rank 0 prints and writes files); `nccl`: as `mpi`,
    /// with each rank on the GPU of its local rank and tensors moved by NCCL.
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    transport: Transport,
    /// `cpu`, or `cuda` / `cuda:N` (build with `--features cuda`): every rank a thread with
    /// its own stream on GPU N, tensors handed between ranks by device-to-device copies, so
    /// activations, gradients and optimizer state stay on the GPU (with `--transport local`).
    /// Default: `cpu`, or with `--transport nccl` the GPU of each rank's local rank.
    #[arg(long, value_parser = parse_device)]
    device: Option<Device>,
    /// Matmul inputs and stored activations: `f32`; `tf32` (matmul inputs rounded to TF32);
    /// `bf16` (bf16 matmul inputs with f32 accumulation, bf16 activations and pipeline
    /// hand-offs, f32 master weights, gradients and AdamW moments). On the CPU the reduced
    /// formats are emulated by rounding, so they train the same numbers, not faster.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    precision: PrecisionArg,
    /// Tensor-parallel ranks inside each pipeline stage (must divide --heads, --kv-heads and
    /// --ffn).
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Data-parallel replicas of the whole pipeline.
    #[arg(long, default_value_t = 1)]
    dp: usize,
    /// Expert-parallel ranks: each mixture's experts sharded over this many data-parallel
    /// replicas (folded over --dp, which it must divide), their rows moved by all-to-all; the
    /// experts' gradients are summed over the replicas holding them (same losses). Needs
    /// --experts divisible by it, --tp 1 and --zero 0; in-process and MPI transports.
    #[arg(long, default_value_t = 1)]
    ep: usize,
    /// ZeRO level: 0 all-reduces gradients and keeps AdamW's state whole on every replica;
    /// 1 reduce-scatters them and keeps 1/dp of the state per replica (same losses).
    /// 2 and 3 are refused with a pipeline, which accumulates gradients across microbatches.
    #[arg(long, default_value_t = 0, value_name = "LEVEL")]
    zero: u32,
    /// Sequence parallelism with --tp: each TP rank keeps its seq/tp slice of the residual
    /// stream, the LayerNorms and the pipeline hand-offs (tp times fewer bytes), all-gathering
    /// before and reduce-scattering after the TP layers; same losses. --seq-len must be
    /// divisible by --tp. With --tp 1 it changes nothing (a warning says so).
    #[arg(long)]
    sequence_parallel: bool,
    /// Sequences per microbatch.
    #[arg(long, default_value_t = 4, value_name = "B")]
    microbatch_size: usize,
    /// Training steps.
    #[arg(long, default_value_t = 40, value_name = "N")]
    steps: u64,
    /// Seed of the weights and the generated data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Transformer blocks (at least the number of stages p*v).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Attention heads (must divide --d-model).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 16)]
    seq_len: usize,
    /// Vocabulary size of the generated task (arithmetic progressions modulo the vocabulary).
    #[arg(long, default_value_t = 64)]
    vocab: usize,
    /// The model's kinds beyond its sizes (key/value heads, MLP, norm, positions, biases); the
    /// reference GPT has every one but tied embeddings.
    #[command(flatten)]
    shape: ShapeArgs,
    /// AdamW learning rate (above 0, at most 1).
    #[arg(long, default_value_t = 3e-3, allow_negative_numbers = true)]
    lr: f32,
    /// Seconds a receive or collective may wait before the run fails.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    timeout: f64,
    /// Write the last step's measured timeline (JSON, for `pipewright viz --from`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the last step's measured bubble chart to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// `json` prints one JSON object per step: loss, tokens per second, measured bubble.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Write the measured per-stage F, B (or I and W) times and the hand-off latency between
    /// devices in ms as a cost file for `simulate --cost-file` and `search --cost-file` (median
    /// over the steps after the first).
    #[arg(long, value_name = "FILE")]
    costs_out: Option<PathBuf>,
    /// When stdout is not a terminal, print a line (loss, tokens/s, step time) every N steps,
    /// and at least every 10 s; 0 for none.
    #[arg(long, default_value_t = 10, value_name = "N")]
    log_interval: u64,
    /// Train on through a NaN or infinite loss or gradient instead of stopping at that step.
    #[arg(long)]
    allow_non_finite: bool,
}

impl TrainCmd {
    /// Flags -> checked run -> training, watched step by step -> files and the summary.
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source.inputs(),
            [
                Output::new("--trace", self.trace.as_ref(), Kind::Json),
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new("--costs-out", self.costs_out.as_ref(), Kind::Json),
            ],
        )?;
        let request = self.request()?;
        request.check().map_err(refused)?;
        let chart_format = self
            .chart
            .as_deref()
            .map(ImageFormat::from_path)
            .transpose()?;
        let (tt, _) = self.source.timetable()?;
        let cfg = self.config(&request, &tt)?;
        let device = self.device()?;
        self.fits(&request.shape().map_err(refused)?, &tt, &cfg.mesh, device)?;
        let universe = match self.transport {
            Transport::Mpi => Some(mpi_universe()?),
            Transport::Nccl => Some(nccl_universe()?),
            Transport::Local => None,
        };
        let lead = universe.as_ref().map_or(true, is_rank_zero);
        // Over MPI or NCCL each rank is its own process: the launcher places them.
        let world = cfg.mesh.world_size();
        let oversubscribed = universe.is_none() && oversubscribed(world).is_some();
        if universe.is_none() && lead {
            warn_oversubscribed(world);
        }
        let tokens = cfg.global_batch(tt.microbatches) as f64 * self.seq_len as f64;
        let mut watch = Watch::new(self, tokens, lead, oversubscribed);
        let on_step = |s: &StepRecord| watch.step(s);
        let finished = match universe {
            Some(u) if self.transport == Transport::Nccl => train_nccl(u, &cfg, &tt, on_step),
            Some(u) => train_mpi(u, &cfg, &tt, on_step),
            None => match device {
                Device::Cpu => train_gpt(&cfg, &tt, on_step).map(Some).map_err(Into::into),
                Device::Cuda(n) => train_cuda(&cfg, &tt, n, on_step).map(Some),
            },
        }
        .map_err(non_finite_hint);
        // Cleared before an error too, so a stopped run's one line stands alone.
        watch.bar.finish_and_clear();
        let finished = finished?;
        std::mem::take(&mut watch.lines).finish()?;
        if finished.is_none() {
            return Ok(()); // an MPI or NCCL rank other than 0: rank 0 reports
        }
        let Some(last) = &watch.last else {
            bail!("no step ran (--steps 0?)")
        };
        stage_measured_costs(&mut outs, &watch.timelines)?;
        let devices = last.device_peaks(&cfg.mesh);
        let bars = MemoryBars {
            label: format!("measured peak memory per device (step {})", last.step),
            devices: &devices,
        };
        stage_outputs(&mut outs, &last.timeline, chart_format, bars)?;
        outs.commit()?;
        if self.format == ReportFormat::Table {
            console::println(&self.summary(&tt, &cfg.mesh, &watch, last, tokens))?;
        }
        Ok(())
    }

    /// The run's configuration, checked by the library, with what changes nothing warned
    /// about.
    fn config(&self, request: &TrainRequest, tt: &Timetable) -> Result<TrainConfig> {
        let cfg = request.config(tt).map_err(refused)?;
        if cfg.run.zero == Zero::One && cfg.mesh.dp == 1 {
            console::note("warning: --zero 1 with --dp 1 changes nothing: the one replica holds all the optimizer state");
        }
        if self.sequence_parallel && cfg.mesh.tp == 1 {
            console::note("warning: --sequence-parallel with --tp 1 changes nothing: there is no group to split the sequence over");
        }
        Ok(cfg)
    }

    /// Refuse a run this machine cannot hold: the ranks' memory on the CPU, and with
    /// `--costs-out` every step's timeline kept.
    fn fits(&self, shape: &ModelShape, tt: &Timetable, mesh: &Mesh, device: Device) -> Result<()> {
        if device == Device::Cpu {
            let ranks_here = match self.transport {
                Transport::Local => mesh.world_size() as u64,
                _ => 1,
            };
            super::budget::training(&self.memory_config(shape, tt, mesh), tt, ranks_here)?;
        }
        if self.costs_out.is_some() {
            let spm = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
            super::budget::timetable("--costs-out (every step's timeline kept)", spm, self.steps)?;
        }
        Ok(())
    }

    /// The table's closing lines: the run in one line, its period and its measured peaks.
    fn summary(
        &self,
        tt: &Timetable,
        mesh: &Mesh,
        watch: &Watch<'_>,
        last: &StepRecord,
        tokens: f64,
    ) -> String {
        format!(
            "{} on pp={} tp={} dp={}: {} steps, loss {:.4} -> {:.4}, last step {:.1} ms, {:.0} tokens/s, measured bubble {:.1}%{}\n{}",
            tt.name, mesh.pp, mesh.tp, mesh.dp, self.steps, watch.first_loss.unwrap_or(f32::NAN),
            last.loss.unwrap_or(f32::NAN), last.seconds * 1e3, tokens / last.seconds.max(1e-9), 100.0 * last.bubble_fraction(),
            period_line(watch.period.period_ms(), tokens), measured::peak_line(last, mesh)
        )
    }
}

/// What a run shows and keeps as its steps finish: the bar or the log lines, or one
/// [`StepReport`] line per step; the last step, the first loss, the period so far, and with
/// `--costs-out` every step's timeline.
struct Watch<'a> {
    cmd: &'a TrainCmd,
    tokens: f64,
    oversubscribed: bool,
    bar: ProgressBar,
    log: StepLog,
    lines: Lines,
    period: MeasuredPeriod,
    first_loss: Option<f32>,
    last: Option<StepRecord>,
    timelines: Vec<Timeline>,
}

impl<'a> Watch<'a> {
    fn new(cmd: &'a TrainCmd, tokens: f64, lead: bool, oversubscribed: bool) -> Self {
        let table = lead && cmd.format == ReportFormat::Table;
        Watch {
            cmd,
            tokens,
            oversubscribed,
            bar: progress(cmd.steps, table),
            log: StepLog::new(if table { cmd.log_interval } else { 0 }, cmd.steps),
            lines: Lines::default(),
            period: MeasuredPeriod::default(),
            first_loss: None,
            last: None,
            timelines: Vec::new(),
        }
    }

    fn step(&mut self, s: &StepRecord) {
        if self.cmd.costs_out.is_some() {
            self.timelines.push(s.timeline.clone());
        }
        self.period.add(s);
        let period_ms = self.period.period_ms();
        let loss = s.loss.unwrap_or(f32::NAN);
        self.first_loss.get_or_insert(loss);
        let tps = self.tokens / s.seconds.max(1e-9);
        match self.cmd.format {
            ReportFormat::Json => {
                let report = StepReport::new(s, self.tokens, period_ms, self.oversubscribed);
                self.lines.try_line(report.to_line());
            }
            ReportFormat::Table => {
                self.bar.set_message(format!(
                    "loss {loss:.4}  {tps:.0} tok/s  bubble {:.1}%{}",
                    100.0 * s.bubble_fraction(),
                    period_ms.map_or(String::new(), |p| format!("  period {p:.1} ms"))
                ));
                self.bar.inc(1);
                if let Some(line) = self.log.line(s.step, loss, tps, s.seconds) {
                    self.lines.line(&line);
                }
            }
        }
        self.last = Some(s.clone());
    }
}

impl TrainCmd {
    /// The flags as the library's [`TrainRequest`] (`--layers` and `--heads` as 32-bit
    /// counts), unchecked.
    fn request(&self) -> Result<TrainRequest> {
        let count = |flag: &str, v: usize| {
            u32::try_from(v).map_err(|_| anyhow!("{flag} {v}: at most {}", u32::MAX))
        };
        Ok(TrainRequest {
            layers: count("--layers", self.layers)?,
            d_model: self.d_model as u64,
            heads: count("--heads", self.heads)?,
            seq_len: self.seq_len as u64,
            vocab: self.vocab as u64,
            kinds: self.shape.kinds(),
            tp: self.tp,
            dp: self.dp,
            ep: self.ep,
            zero: self.zero,
            sequence_parallel: self.sequence_parallel,
            microbatch_size: self.microbatch_size,
            steps: self.steps,
            seed: self.seed,
            lr: self.lr,
            timeout: self.timeout,
            precision: self.precision.into(),
            recompute: self.source.recompute.clone(),
            allow_non_finite: self.allow_non_finite,
        })
    }

    /// The memory model's view of this run (pipewright's own accounting of the reference
    /// GPT), for the estimate made before anything is allocated.
    fn memory_config(&self, shape: &ModelShape, tt: &Timetable, mesh: &Mesh) -> MemoryConfig {
        let u32_of = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        MemoryConfig {
            precision: match self.precision {
                PrecisionArg::Bf16 => MemPrecision::Bf16,
                _ => MemPrecision::F32,
            },
            tp: u32_of(mesh.tp),
            dp: u32_of(mesh.dp),
            v: (tt.num_stages() / tt.num_devices().max(1)).max(1),
            microbatch_size: self.microbatch_size as u64,
            sequence_parallel: self.sequence_parallel,
            zero: self.zero as u8,
            recompute: self.source.recompute.clone(),
            // The experts sharded over `ep` replicas (ZeRO-1 beside EP is refused before).
            experts: ExpertLayout {
                ep: u32_of(mesh.ep),
                ..ExpertLayout::default()
            },
            ..MemoryConfig::new(*shape, u32_of(mesh.pp)).with_accounting(Accounting::Pipewright)
        }
    }

    /// Where tensors live: `--device`, checked against the transport. Over NCCL each rank
    /// takes the GPU of its local rank, so a device named on the command line (the same for
    /// every rank) cannot be honoured.
    fn device(&self) -> Result<Device> {
        let device = self.device_for_transport()?;
        // Before the run's notes: an in-process GPU run this build cannot make.
        if cfg!(not(feature = "cuda"))
            && self.transport == Transport::Local
            && matches!(device, Device::Cuda(_))
        {
            bail!(NO_CUDA);
        }
        Ok(device)
    }

    /// `--device` against `--transport`.
    fn device_for_transport(&self) -> Result<Device> {
        match (self.transport, self.device) {
            (Transport::Nccl, None | Some(Device::Cuda(0))) => Ok(Device::Cuda(0)),
            (Transport::Nccl, Some(Device::Cpu)) => {
                bail!("--transport nccl moves GPU tensors: use --device cuda (or leave --device out), or --transport mpi for CPU ranks")
            }
            (Transport::Nccl, Some(Device::Cuda(_))) => {
                bail!("--transport nccl puts each rank on the GPU of its local rank: use --device cuda, not cuda:N")
            }
            (Transport::Mpi, Some(Device::Cuda(_))) => {
                bail!("--transport mpi moves CPU tensors: for GPUs across processes use --transport nccl")
            }
            (_, d) => Ok(d.unwrap_or(Device::Cpu)),
        }
    }
}

#[cfg(feature = "mpi")]
fn is_rank_zero(u: &pipewright::runtime::comm::mpi::Universe) -> bool {
    pipewright::runtime::comm::mpi::world_rank(u) == 0
}

#[cfg(not(feature = "mpi"))]
fn is_rank_zero(u: &std::convert::Infallible) -> bool {
    match *u {}
}

#[cfg(feature = "mpi")]
fn train_mpi(
    u: pipewright::runtime::comm::mpi::Universe,
    cfg: &TrainConfig,
    tt: &Checked,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    pipewright::runtime::train_gpt_mpi(u, cfg, tt, on_step).map_err(launch_hint)
}

/// A world of the wrong size most often means a launch without mpirun: say how to launch.
#[cfg(feature = "mpi")]
pub(super) fn launch_hint(e: pipewright::runtime::RuntimeError) -> anyhow::Error {
    use pipewright::runtime::{MeshError, RuntimeError};
    match e {
        RuntimeError::Mesh(MeshError::WorldSize { product, .. }) => {
            anyhow::anyhow!(
                "{e}: launch {product} processes, e.g. mpirun -np {product} pipewright ..."
            )
        }
        e => e.into(),
    }
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(
    u: std::convert::Infallible,
    _: &TrainConfig,
    _: &Checked,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    match u {}
}

#[cfg(all(feature = "nccl", feature = "mpi"))]
fn train_nccl(
    u: MpiUniverse,
    cfg: &TrainConfig,
    tt: &Checked,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    pipewright::runtime::train_gpt_nccl_mpi(u, cfg, tt, on_step).map_err(launch_hint)
}

/// Unreachable in practice (`nccl_universe` refuses first in such a build), but an error,
/// not a panic, if it ever is reached.
#[cfg(not(all(feature = "nccl", feature = "mpi")))]
fn train_nccl(
    _: MpiUniverse,
    _: &TrainConfig,
    _: &Checked,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    bail!("--transport nccl: this pipewright was built without NCCL and MPI")
}

#[cfg(feature = "cuda")]
fn train_cuda(
    cfg: &TrainConfig,
    tt: &Checked,
    ordinal: usize,
    on_step: impl FnMut(&StepRecord),
) -> Result<FinalParams> {
    Ok(pipewright::runtime::train_gpt_cuda(
        cfg, tt, ordinal, on_step,
    )?)
}

#[cfg(not(feature = "cuda"))]
fn train_cuda(
    _: &TrainConfig,
    _: &Checked,
    _: usize,
    _: impl FnMut(&StepRecord),
) -> Result<FinalParams> {
    bail!(NO_CUDA)
}

/// A training request's refusal in the command line's words (`--seq-len`); an error of the
/// model's shape, its sizes or the mesh keeps its own chain of causes.
fn refused(e: TrainRequestError) -> anyhow::Error {
    match e {
        TrainRequestError::Shape(e) => e.into(),
        TrainRequestError::Sizes(e) => e.into(),
        TrainRequestError::Mesh(e) => e.into(),
        e => anyhow!(e.named(&|f| flag_form(f, None))),
    }
}

/// Why `--device cuda` cannot run in this build.
const NO_CUDA: &str = "--device cuda: this pipewright was built without CUDA; rebuild with: cargo build --release --features cuda";

/// A run stopped by the NaN check says how to train on regardless.
fn non_finite_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<RuntimeError>() {
        Some(RuntimeError::NonFinite { .. }) => {
            anyhow::anyhow!("{e} (--allow-non-finite trains on)")
        }
        _ => e,
    }
}

fn progress(steps: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}") {
        bar.set_style(style);
    }
    bar
}

/// Stage `--trace` and `--chart` of the last step, when asked for.
fn stage_outputs(
    outs: &mut Outputs,
    timeline: &Timeline,
    chart: Option<ImageFormat>,
    memory: MemoryBars<'_>,
) -> Result<()> {
    if outs.has("--trace") {
        outs.stage("--trace", serde_json::to_string(timeline)?.as_bytes())?;
    }
    if let Some(fmt) = chart {
        let panels = [ChartPanel::new(timeline)];
        let opts = ChartOptions::default();
        let bytes = bubble_chart_with_memory(&panels, &[memory], &opts, fmt)?;
        outs.stage("--chart", &bytes)?;
    }
    Ok(())
}
