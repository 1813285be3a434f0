//! `train` (the reference GPT over in-process devices) and `bench` (synthetic stages of exact
//! durations, measured against the simulator).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pipewright::kernels::gpt::GptConfig;
use pipewright::kernels::optim::AdamWConfig;
use pipewright::runtime::{
    gpt_config, run, train_gpt, Coord, FinalParams, Mesh, MicrobatchId, ModuleError, RunOptions,
    RuntimeError, StepRecord, StepReport, SyntheticModule, TrainConfig, Zero,
};
use pipewright::schedule::{simulate, Timeline, Timetable};
use pipewright::viz::{
    bubble_chart, bubble_chart_with_memory, ChartOptions, ChartPanel, ImageFormat, MemoryBars,
};

use super::args::{
    mpi_universe, nccl_universe, parse_device, CostArgs, Device, MpiUniverse, PrecisionArg,
    SourceArgs, Transport,
};
use super::checks::{at_least, in_range, Kind, Output};
use super::commands::ReportFormat;
use super::console::{self, Lines};
use super::measured;
use super::outputs::Outputs;
use super::progress::{
    oversubscribed, oversubscription_json, warn_oversubscribed, working, StepLog,
};
use super::search::stage_measured_costs;
use super::shape::ShapeArgs;
use super::steady::{bench_periods, period_compare, period_json, period_line, MeasuredPeriod};
use pipewright::schedule::memory::{Accounting, MemPrecision, MemoryConfig, ModelShape};

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
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source.inputs(),
            [
                Output::new("--trace", self.trace.as_ref(), Kind::Json),
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new("--costs-out", self.costs_out.as_ref(), Kind::Json),
            ],
        )?;
        self.check_numbers()?;
        let chart_format = self
            .chart
            .as_deref()
            .map(ImageFormat::from_path)
            .transpose()?;
        let (tt, _) = self.source.timetable()?;
        if self.layers < tt.num_stages() as usize {
            bail!(
                "--layers {}: {} stages need at least {} layers (one or more per stage)",
                self.layers,
                tt.num_stages(),
                tt.num_stages()
            );
        }
        let mesh = Mesh::new(tt.num_devices() as usize, self.tp, self.dp)?;
        let zero = Zero::from_level(self.zero, mesh.pp)
            .map_err(|e| anyhow!("--zero {}: {e}", self.zero))?;
        if zero == Zero::One && mesh.dp == 1 {
            console::note("warning: --zero 1 with --dp 1 changes nothing: the one replica holds all the optimizer state");
        }
        if self.sequence_parallel && mesh.tp == 1 {
            console::note("warning: --sequence-parallel with --tp 1 changes nothing: there is no group to split the sequence over");
        }
        if self.sequence_parallel && self.seq_len % mesh.tp != 0 {
            bail!(
                "--sequence-parallel: --seq-len {} is not divisible by --tp {} (each TP rank keeps a slice of seq-len / tp positions)",
                self.seq_len,
                mesh.tp
            );
        }
        let model = self.model()?;
        let cfg = TrainConfig {
            mesh,
            model,
            microbatch_size: self.microbatch_size,
            sequence_parallel: self.sequence_parallel,
            seed: self.seed,
            run: RunOptions {
                steps: self.steps,
                timeout: timeout(self.timeout)?,
                adamw: AdamWConfig {
                    lr: self.lr,
                    ..AdamWConfig::default()
                },
                // The timetable carries the R actions; the plan says what each stage keeps.
                recompute: self.source.recompute.clone(),
                precision: self.precision.into(),
                zero,
                check_finite: !self.allow_non_finite,
                ..RunOptions::default()
            },
        };
        let tokens = cfg.global_batch(tt.microbatches) as f64 * self.seq_len as f64;
        let device = self.device()?;
        if device == Device::Cpu {
            let ranks_here = match self.transport {
                Transport::Local => mesh.world_size() as u64,
                _ => 1,
            };
            super::budget::training(&self.memory_config(&tt, &mesh)?, &tt, ranks_here)?;
        }
        if self.costs_out.is_some() {
            let spm = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
            super::budget::timetable("--costs-out (every step's timeline kept)", spm, self.steps)?;
        }
        let universe = match self.transport {
            Transport::Mpi => Some(mpi_universe()?),
            Transport::Nccl => Some(nccl_universe()?),
            Transport::Local => None,
        };
        let lead = universe.as_ref().map_or(true, is_rank_zero);
        let table = lead && self.format == ReportFormat::Table;
        let bar = progress(self.steps, table);
        let mut log = StepLog::new(if table { self.log_interval } else { 0 }, self.steps);
        // Over MPI or NCCL each rank is its own process: the launcher places them.
        let oversubscribed = universe.is_none() && oversubscribed(mesh.world_size()).is_some();
        if universe.is_none() && lead {
            warn_oversubscribed(mesh.world_size());
        }
        let mut last: Option<StepRecord> = None;
        let mut first_loss = None;
        let mut timelines = Vec::new();
        let mut period = MeasuredPeriod::default();
        let mut lines = Lines::default();
        let on_step = |s: &StepRecord| {
            if self.costs_out.is_some() {
                timelines.push(s.timeline.clone());
            }
            period.add(s);
            let period_ms = period.period_ms();
            let loss = s.loss.unwrap_or(f32::NAN);
            first_loss.get_or_insert(loss);
            let tps = tokens / s.seconds.max(1e-9);
            match self.format {
                ReportFormat::Json => {
                    lines.try_line(StepReport::new(s, tokens, period_ms, oversubscribed).to_line())
                }
                ReportFormat::Table => {
                    bar.set_message(format!(
                        "loss {loss:.4}  {tps:.0} tok/s  bubble {:.1}%{}",
                        100.0 * s.bubble_fraction(),
                        period_ms.map_or(String::new(), |p| format!("  period {p:.1} ms"))
                    ));
                    bar.inc(1);
                    if let Some(line) = log.line(s.step, loss, tps, s.seconds) {
                        lines.line(&line);
                    }
                }
            }
            last = Some(s.clone());
        };
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
        bar.finish_and_clear();
        let finished = finished?;
        lines.finish()?;
        if finished.is_none() {
            return Ok(()); // an MPI or NCCL rank other than 0: rank 0 reports
        }
        let period_ms = period.period_ms();
        let Some(last) = last else {
            bail!("no step ran (--steps 0?)")
        };
        stage_measured_costs(&mut outs, &timelines)?;
        let devices = last.device_peaks(&mesh);
        let bars = MemoryBars {
            label: format!("measured peak memory per device (step {})", last.step),
            devices: &devices,
        };
        stage_outputs(&mut outs, &last.timeline, chart_format, bars)?;
        outs.commit()?;
        if self.format == ReportFormat::Table {
            console::println(&format!(
                "{} on pp={} tp={} dp={}: {} steps, loss {:.4} -> {:.4}, last step {:.1} ms, {:.0} tokens/s, measured bubble {:.1}%{}\n{}",
                tt.name, mesh.pp, mesh.tp, mesh.dp, self.steps, first_loss.unwrap_or(f32::NAN),
                last.loss.unwrap_or(f32::NAN), last.seconds * 1e3, tokens / last.seconds.max(1e-9), 100.0 * last.bubble_fraction(),
                period_line(period_ms, tokens), measured::peak_line(&last, &mesh)
            ))?;
        }
        Ok(())
    }
}

impl TrainCmd {
    /// Hyperparameters and sizes, checked before any work so that a bad one fails in one
    /// line instead of inside step 0 or as a NaN loss.
    fn check_numbers(&self) -> Result<()> {
        in_range(
            "--lr",
            self.lr,
            0.0,
            1.0,
            "AdamW's learning rate; the default is 3e-3",
        )?;
        in_range(
            "--timeout",
            self.timeout,
            0.0,
            1e6,
            "seconds a receive may wait",
        )?;
        at_least(
            "--vocab",
            self.vocab,
            2,
            "a next-token task needs two tokens or more",
        )?;
        at_least("--seq-len", self.seq_len, 1, "tokens per sequence")?;
        at_least(
            "--microbatch-size",
            self.microbatch_size,
            1,
            "sequences per microbatch",
        )?;
        at_least("--heads", self.heads, 1, "attention heads")?;
        for (flag, value) in [("--layers", self.layers), ("--heads", self.heads)] {
            if u32::try_from(value).is_err() {
                bail!("{flag} {value}: at most {}", u32::MAX);
            }
        }
        at_least("--d-model", self.d_model, 1, "width of the residual stream")?;
        at_least("--tp", self.tp, 1, "tensor-parallel ranks")?;
        at_least("--dp", self.dp, 1, "data-parallel replicas")?;
        at_least("--steps", self.steps as usize, 1, "training steps")?;
        self.model()?.validate(self.tp)?;
        Ok(())
    }

    /// The model's description from the flags: the sizes and the shape's kinds.
    fn shape(&self) -> Result<ModelShape> {
        let size =
            |flag: &str, v: usize| u32::try_from(v).map_err(|_| anyhow!("{flag} {v} is too large"));
        self.shape.shape(
            size("--layers", self.layers)?,
            self.d_model as u64,
            size("--heads", self.heads)?,
            self.seq_len as u64,
            self.vocab as u64,
        )
    }

    /// The reference GPT of the flags (checked; a kind the reference lacks refused in one
    /// line).
    fn model(&self) -> Result<GptConfig> {
        // The reference refuses tied embeddings only.
        gpt_config(&self.shape()?).map_err(|e| anyhow!("--tied-embeddings: {e}"))
    }

    /// The memory model's view of this run (pipewright's own accounting of the reference
    /// GPT), for the estimate made before anything is allocated.
    fn memory_config(&self, tt: &Timetable, mesh: &Mesh) -> Result<MemoryConfig> {
        let u32_of = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        Ok(MemoryConfig {
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
            ..MemoryConfig::new(self.shape()?, u32_of(mesh.pp))
                .with_accounting(Accounting::Pipewright)
        })
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
    tt: &Timetable,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    pipewright::runtime::train_gpt_mpi(u, cfg, tt, on_step).map_err(launch_hint)
}

/// A world of the wrong size most often means a launch without mpirun: say how to launch.
#[cfg(feature = "mpi")]
fn launch_hint(e: pipewright::runtime::RuntimeError) -> anyhow::Error {
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
    _: &Timetable,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    match u {}
}

#[cfg(all(feature = "nccl", feature = "mpi"))]
fn train_nccl(
    u: MpiUniverse,
    cfg: &TrainConfig,
    tt: &Timetable,
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
    _: &Timetable,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    bail!("--transport nccl: this pipewright was built without NCCL and MPI")
}

#[cfg(feature = "mpi")]
#[allow(clippy::too_many_arguments)]
fn bench_mpi(
    u: pipewright::runtime::comm::mpi::Universe,
    mesh: Mesh,
    tt: &Timetable,
    make: impl Fn(Coord, u32) -> Result<SyntheticModule, pipewright::runtime::ModuleError>,
    data: impl Fn(MicrobatchId) -> Result<(), ModuleError>,
    opts: &RunOptions,
    describe: &str,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    pipewright::runtime::run_mpi(u, mesh, tt, make, data, opts, describe, on_step)
        .map_err(launch_hint)
}

#[cfg(not(feature = "mpi"))]
#[allow(clippy::too_many_arguments)]
fn bench_mpi(
    u: std::convert::Infallible,
    _: Mesh,
    _: &Timetable,
    _: impl Fn(Coord, u32) -> Result<SyntheticModule, pipewright::runtime::ModuleError>,
    _: impl Fn(MicrobatchId) -> Result<(), ModuleError>,
    _: &RunOptions,
    _: &str,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    match u {}
}

#[cfg(feature = "cuda")]
fn train_cuda(
    cfg: &TrainConfig,
    tt: &Timetable,
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
    _: &Timetable,
    _: usize,
    _: impl FnMut(&StepRecord),
) -> Result<FinalParams> {
    bail!(NO_CUDA)
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

fn timeout(secs: f64) -> Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        bail!("--timeout must be a positive number of seconds (got {secs})");
    }
    Ok(Duration::from_secs_f64(secs))
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

/// Run a timetable with synthetic stages of exact durations and compare with the simulator.
#[derive(Args, Debug)]
pub struct BenchCmd {
    #[command(flatten)]
    source: SourceArgs,
    /// Durations in milliseconds: the cost flags' units are milliseconds here.
    #[command(flatten)]
    costs: CostArgs,
    /// Steps to run; the report is the median step.
    #[arg(long, default_value_t = 5)]
    steps: u64,
    /// `local`: every device a thread of this process; `mpi`: one process per device
    /// (`mpirun -np <p>`; rank 0 reports).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    transport: Transport,
    /// Write the median step's measured timeline (JSON).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the median measured step next to the simulated one (FILE.svg or FILE.png).
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// Output form.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Write the measured per-stage times and the hand-off latency between devices in ms as a
    /// cost file (median over the steps after the first).
    #[arg(long, value_name = "FILE")]
    costs_out: Option<PathBuf>,
}

impl BenchCmd {
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source.inputs().chain(self.costs.inputs()),
            [
                Output::new("--trace", self.trace.as_ref(), Kind::Json),
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new("--costs-out", self.costs_out.as_ref(), Kind::Json),
            ],
        )?;
        let chart_format = self
            .chart
            .as_deref()
            .map(ImageFormat::from_path)
            .transpose()?;
        at_least(
            "--steps",
            self.steps as usize,
            1,
            "steps to run and measure",
        )?;
        let (tt, _) = self.source.timetable()?;
        // Each step's timeline is kept, on top of the runtime's own per-action state.
        let spm = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
        super::budget::timetable("bench", spm, self.steps.saturating_mul(2).saturating_add(8))?;
        let model = self.costs.model(tt.num_stages(), tt.num_devices())?;
        let sim = simulate(&tt, &model)?;
        let mesh = Mesh::new(tt.num_devices() as usize, 1, 1)?;
        let last = tt.num_stages() - 1;
        let make = |_: Coord, s: u32| {
            Ok(SyntheticModule::from_cost_ms(
                &model.stages[s as usize],
                s == last,
            ))
        };
        // Synthetic stages read no data.
        let data = |_| Ok(());
        let opts = RunOptions {
            steps: self.steps,
            ..RunOptions::default()
        };
        let mut steps = Vec::new();
        let on_step = |s: &StepRecord| steps.push(s.clone());
        let threads = mesh.world_size();
        match self.transport {
            Transport::Local => {
                warn_oversubscribed(threads);
                let spinner = working(format!("bench: {} steps of {}", opts.steps, tt.name));
                let r = run(mesh, &tt, make, data, &opts, on_step);
                spinner.finish_and_clear();
                r?;
            }
            Transport::Nccl => {
                bail!("bench runs synthetic stages on host tensors: use --transport local or mpi")
            }
            Transport::Mpi => {
                let describe = format!("{model:?}");
                if bench_mpi(
                    mpi_universe()?,
                    mesh,
                    &tt,
                    make,
                    data,
                    &opts,
                    &describe,
                    on_step,
                )?
                .is_none()
                {
                    return Ok(()); // an MPI rank other than 0: rank 0 reports
                }
            }
        }
        let (measured_period, simulated_period) = bench_periods(&tt, &model, &steps)?;
        steps.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let median = &steps[steps.len() / 2];
        let measured = median.seconds * 1e3;
        let predicted = sim.report.makespan;
        let actions = tt.len();
        let overhead_us = (measured - predicted) * 1e3 / actions as f64;
        let report = match self.format {
            ReportFormat::Json => serde_json::json!({"measured_ms": measured, "simulated_ms": predicted, "ratio": (predicted > 0.0).then(|| measured / predicted),
                    "compute_actions": actions, "overhead_us_per_action": overhead_us,
                    "measured_bubble": median.bubble_fraction(), "simulated_bubble": sim.report.bubble_fraction,
                    "steady_state": period_json(measured_period, simulated_period),
                    "threads": (self.transport == Transport::Local).then(|| oversubscription_json(threads))}).to_string(),
            ReportFormat::Table => format!(
                "{}: measured {measured:.3} ms, simulated {predicted:.3} ms ({}), {actions} compute actions, {overhead_us:.2} us overhead per action; bubble measured {:.2}% vs simulated {:.2}%\n{}",
                tt.name,
                if predicted > 0.0 { format!("{:+.2}%", 100.0 * (measured / predicted - 1.0)) } else { "no simulated time".into() },
                100.0 * median.bubble_fraction(),
                100.0 * sim.report.bubble_fraction,
                period_compare(measured_period, simulated_period)
            ),
        };
        if outs.has("--trace") {
            outs.stage(
                "--trace",
                serde_json::to_string(&median.timeline)?.as_bytes(),
            )?;
        }
        let mut ordered: Vec<&StepRecord> = steps.iter().collect();
        ordered.sort_by_key(|s| s.step);
        let timelines: Vec<_> = ordered.iter().map(|s| s.timeline.clone()).collect();
        stage_measured_costs(&mut outs, &timelines)?;
        if let Some(fmt) = chart_format {
            let mut simulated = sim.timeline.clone();
            simulated.meta.time_unit = "ms".into();
            let panels = [
                ChartPanel::new(&median.timeline).with_label("measured"),
                ChartPanel::new(&simulated).with_label("simulated"),
            ];
            let bytes = bubble_chart(&panels, &ChartOptions::default(), fmt)?;
            outs.stage("--chart", &bytes)?;
        }
        outs.commit()?;
        console::println(&report)
    }
}
