//! Flags shared by several subcommands.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use pipewright::schedule::shape::request::flag_form;
use pipewright::schedule::simulate::{CostOptions, CostSource};
use pipewright::schedule::{
    generate, recompute, Checked, CostModel, RawSpec, RecomputeError, RecomputePlan, ScheduleKind,
    ScheduleSpec, StageCost, Timetable,
};

use super::outputs::Input;

/// A spec's field as its flag (`p` is `--stages`): how a [`pipewright::schedule::SpecError`]
/// names it here.
pub fn spec_flag(field: &str) -> String {
    match field {
        "p" => "--stages".into(),
        "v" => "--virtual".into(),
        "m" => "--microbatches".into(),
        f => flag_form(f, None),
    }
}

/// Which schedule to generate.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Schedule family: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zbv or dualpipev.
    #[arg(long, default_value = "1f1b", value_name = "NAME")]
    pub schedule: String,
    /// Pipeline devices p (pipeline-parallel size); each holds --virtual stages.
    #[arg(long, short = 'p', default_value_t = 4, value_name = "P")]
    pub stages: u32,
    /// Model chunks per device v (total stages S = p * v): any v for interleaved-1f1b and
    /// looped-bfs; zbv and dualpipev need 2 (a V of two chunks); the others take 1.
    #[arg(long = "virtual", short = 'v', default_value_t = 1, value_name = "V")]
    pub virtual_stages: u32,
    /// Microbatches m per training step (any m >= 1; interleaving needs m >= p).
    #[arg(long, short = 'm', default_value_t = 8, value_name = "M")]
    pub microbatches: u32,
    /// Microbatch group size g of interleaved-1f1b (default p; at least p).
    #[arg(long, value_name = "G")]
    pub group_size: Option<u32>,
}

impl SpecArgs {
    /// The validated spec.
    pub fn spec(&self) -> Result<ScheduleSpec> {
        let raw = RawSpec {
            schedule: self.schedule.clone(),
            devices: self.stages,
            virtual_stages: self.virtual_stages,
            microbatches: self.microbatches,
            group_size: self.group_size,
        };
        ScheduleSpec::from_raw(&raw).map_err(|e| anyhow!(e.named(spec_flag)))
    }

    /// Refuse a timetable this machine could not hold `times` over (steps, panels) while
    /// simulating it.
    pub fn fits(&self, times: u64) -> Result<()> {
        let spm =
            u64::from(self.stages) * u64::from(self.virtual_stages) * u64::from(self.microbatches);
        super::budget::timetable(
            &format!(
                "p={} v={} m={}",
                self.stages, self.virtual_stages, self.microbatches
            ),
            spm,
            times,
        )
    }
}

/// Where a timetable comes from: generated from flags, or read from a file.
///
/// Beside a file, a schedule flag given on the command line must agree with the file (it is
/// then harmless) and one the file cannot honour is refused: a silently ignored `--stages 4`
/// would run a 2-device file on 2 devices. Defaults never count as given.
#[derive(Debug, Clone)]
pub struct SourceArgs {
    pub spec: SpecArgs,
    /// Use this timetable (PyTorch CSV or pipewright JSON) instead of generating one.
    pub timetable: Option<PathBuf>,
    /// Recomputation per stage, written into the timetable as `R` actions.
    pub recompute: RecomputePlan,
    /// Ids of the schedule flags given on the command line.
    given: Vec<&'static str>,
}

/// The flags of [`SourceArgs`] as clap derives them; the wrapper adds which were given.
#[derive(Args, Debug, Clone)]
struct SourceFlags {
    #[command(flatten)]
    spec: SpecArgs,
    /// Use this timetable (PyTorch CSV or pipewright JSON) instead of generating one; schedule
    /// flags beside it must agree with it.
    #[arg(long, value_name = "FILE")]
    timetable: Option<PathBuf>,
    /// Activation recomputation: `none`, `full` (keep only each stage's input and run its
    /// forward again), `selective` (keep all but the attention probabilities), or per stage
    /// (`0:full,1:selective`, the rest none). Adds an `R` action right before each backward
    /// of the stages named (a timetable's own `R`s stay where they are); the simulator
    /// charges each R the stage's `r` cost (default: its forward) and counts only the input
    /// (`kept_bytes`) as stashed until then.
    #[arg(long, default_value = "none", value_name = "POLICY", value_parser = parse_recompute)]
    recompute: RecomputePlan,
}

/// `--recompute`, read by the schedule crate's parser (its error is the line clap shows).
pub fn parse_recompute(s: &str) -> std::result::Result<RecomputePlan, String> {
    s.parse().map_err(|e: RecomputeError| e.to_string())
}

/// Clap ids of the schedule flags, with their command-line spelling.
const SPEC_FLAGS: [(&str, &str); 5] = [
    ("schedule", "--schedule"),
    ("stages", "--stages"),
    ("virtual_stages", "--virtual"),
    ("microbatches", "--microbatches"),
    ("group_size", "--group-size"),
];

impl FromArgMatches for SourceArgs {
    fn from_arg_matches(m: &ArgMatches) -> std::result::Result<Self, clap::Error> {
        let flags = SourceFlags::from_arg_matches(m)?;
        let given = SPEC_FLAGS
            .iter()
            .map(|&(id, _)| id)
            .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
            .collect();
        Ok(SourceArgs {
            spec: flags.spec,
            timetable: flags.timetable,
            recompute: flags.recompute,
            given,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for SourceArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        SourceFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        SourceFlags::augment_args_for_update(cmd)
    }
}

/// What a file fixes about a step, to check flags against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileShape {
    /// Devices p.
    pub devices: u32,
    /// Stages S.
    pub stages: u32,
    /// Microbatches m.
    pub microbatches: u32,
    /// Schedule name (`custom` when the file does not say).
    pub schedule: String,
}

impl FileShape {
    /// The shape of a timetable.
    pub fn of(tt: &Timetable) -> Self {
        FileShape {
            devices: tt.num_devices(),
            stages: tt.num_stages(),
            microbatches: tt.microbatches,
            schedule: tt.name.clone(),
        }
    }
}

impl SourceArgs {
    /// The file it reads, for [`Outputs::plan`](super::outputs::Outputs::plan).
    pub fn inputs(&self) -> impl Iterator<Item = Option<Input<'_>>> {
        std::iter::once(Input::new("--timetable", self.timetable.as_ref()))
    }

    /// Whether schedule flag `id` (its clap id, e.g. `stages`) was given on the command line.
    pub fn given(&self, id: &str) -> bool {
        self.given.contains(&id)
    }

    /// The timetable, and for a generated one its spec; with `--recompute`, with its `R`s.
    pub fn timetable(&self) -> Result<(Checked, Option<ScheduleSpec>)> {
        let (tt, spec) = match &self.timetable {
            Some(path) => {
                let tt = crate::cli::io::load_timetable(path)?;
                self.agree_with(path, &FileShape::of(&tt))?;
                (tt, None)
            }
            None => {
                let spec = self.spec.spec()?;
                self.spec.fits(1)?;
                (checked(generate(&spec))?, Some(spec))
            }
        };
        if self.recompute.is_none() {
            return Ok((tt, spec));
        }
        self.recompute
            .check(tt.num_stages())
            .map_err(|e| anyhow::anyhow!("--recompute: {e}"))?;
        Ok((checked(recompute::insert(&tt, &self.recompute))?, spec))
    }

    /// Refuse a schedule flag given beside `path` that contradicts it or that it cannot
    /// honour, in one line naming both values.
    pub fn agree_with(&self, path: &Path, file: &FileShape) -> Result<()> {
        let name = path.display();
        let s = &self.spec;
        let v = (file.devices > 0 && file.stages % file.devices == 0)
            .then(|| file.stages / file.devices);
        let schedule_agrees = s
            .schedule
            .parse::<ScheduleKind>()
            .is_ok_and(|k| k.name() == file.schedule);
        for (id, flag) in SPEC_FLAGS.iter().filter(|(id, _)| self.given(id)) {
            let (ours, theirs) = match *id {
                "stages" if s.stages != file.devices => {
                    (s.stages.to_string(), format!("{} devices", file.devices))
                }
                "virtual_stages" if Some(s.virtual_stages) != v => (
                    s.virtual_stages.to_string(),
                    format!("{} stages on {} devices", file.stages, file.devices),
                ),
                "microbatches" if s.microbatches != file.microbatches => (
                    s.microbatches.to_string(),
                    format!("{} microbatches", file.microbatches),
                ),
                "schedule" if !schedule_agrees => {
                    (s.schedule.clone(), format!("schedule `{}`", file.schedule))
                }
                "group_size" => bail!(
                    "{flag} does not apply to {name}: the file fixes the order of its actions; leave {flag} out"
                ),
                _ => continue,
            };
            bail!("{flag} {ours} contradicts {name}, which has {theirs}: leave {flag} out or change the file");
        }
        Ok(())
    }
}

/// Durations, sizes and link speed for the simulator.
#[derive(Args, Debug, Clone)]
pub struct CostArgs {
    /// Uniform costs F,B[,W]: forward, full backward and (optionally) its weight part, for
    /// one microbatch on one device's share of the model. With --virtual v each chunk costs
    /// 1/v of this. W defaults to B/2; the input part I is B - W.
    /// [default: 1,2]
    #[arg(
        long,
        value_name = "F,B[,W]",
        conflicts_with = "cost_file",
        allow_hyphen_values = true
    )]
    pub cost: Option<String>,
    /// JSON cost file with per-stage costs: {"default": {"f":..,"b":..,"w":..,
    /// "activation_bytes":..,"p2p_bytes":..}, "stages": [{..}, ...], "p2p_latency":..,
    /// "bandwidth":..}. Stage entries override the default, one entry per stage.
    #[arg(long, value_name = "FILE")]
    pub cost_file: Option<PathBuf>,
    /// Fixed time of each point-to-point transfer, in cost units (overrides the cost file).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub p2p_latency: Option<f64>,
    /// Link bandwidth in bytes per cost unit (default: infinite; overrides the cost file).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub bandwidth: Option<f64>,
    /// Activation bytes one device's share stashes per microbatch (split over v chunks):
    /// bytes, or with a unit (1MiB, 2.5GB) [default: 0].
    #[arg(
        long,
        value_name = "BYTES",
        conflicts_with = "cost_file",
        value_parser = parse_byte_count
    )]
    pub activation_bytes: Option<u64>,
    /// Fraction of a stage's activations still held after its input backward (I) until its
    /// weight backward (W), in [0, 1]; the rest is freed when I ends (overrides the cost
    /// file). Default 1: W holds all of them. The zero-bubble paper's transformer layer keeps
    /// M_W/M_B = 32h/(34h+5as), e.g. 0.366 for h=2304, a=24, s=1024.
    #[arg(long, value_name = "FRACTION", allow_negative_numbers = true)]
    pub w_memory: Option<f64>,
    /// Bytes sent at each stage boundary per microbatch (activation or its gradient):
    /// bytes, or with a unit (1MiB) [default: 0].
    #[arg(
        long,
        value_name = "BYTES",
        conflicts_with = "cost_file",
        value_parser = parse_byte_count
    )]
    pub p2p_bytes: Option<u64>,
}

/// A byte count, read by the one byte parser of every byte flag (and of memory caps' units).
pub fn parse_byte_count(s: &str) -> std::result::Result<u64, String> {
    pipewright::schedule::search::parse_bytes(s).map_err(|e| e.to_string())
}

impl CostArgs {
    /// The file it reads, for [`Outputs::plan`](super::outputs::Outputs::plan).
    pub fn inputs(&self) -> impl Iterator<Item = Option<Input<'_>>> {
        std::iter::once(Input::new("--cost-file", self.cost_file.as_ref()))
    }

    /// The cost model for a timetable of `stages` stages over `devices` devices.
    pub fn model(&self, stages: u32, devices: u32) -> Result<CostModel> {
        let source = match &self.cost_file {
            Some(path) => CostSource::Model(crate::cli::io::load_cost_file(path, stages)?),
            None => {
                let mut cost = self.uniform()?;
                cost.activation_bytes = self.activation_bytes.unwrap_or(0);
                cost.p2p_bytes = self.p2p_bytes.unwrap_or(0);
                CostSource::Uniform(cost)
            }
        };
        let options = CostOptions {
            p2p_latency: self.p2p_latency,
            bandwidth: self.bandwidth,
            w_memory: self.w_memory,
            ..CostOptions::from(source)
        };
        Ok(options.model(stages, devices)?)
    }

    /// The unit of the costs' times: the cost file's `time_unit`, when it names one.
    pub fn time_unit(&self) -> Result<Option<String>> {
        match &self.cost_file {
            Some(path) => crate::cli::io::cost_file_time_unit(path),
            None => Ok(None),
        }
    }

    /// The cost flags given on the command line that set times (they mean nothing beside a
    /// timeline, whose times are given).
    pub fn time_flags(&self) -> Vec<&'static str> {
        [
            ("--cost", self.cost.is_some()),
            ("--p2p-latency", self.p2p_latency.is_some()),
            ("--bandwidth", self.bandwidth.is_some()),
            ("--p2p-bytes", self.p2p_bytes.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The cost flags given that size activations (what a memory panel draws).
    pub fn size_flags(&self) -> Vec<&'static str> {
        [
            ("--activation-bytes", self.activation_bytes.is_some()),
            ("--w-memory", self.w_memory.is_some()),
            ("--cost-file", self.cost_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    fn uniform(&self) -> Result<StageCost> {
        let text = self.cost.as_deref().unwrap_or("1,2");
        let parts = text
            .split(',')
            .map(|x| x.trim().parse::<f64>())
            .map(|x| x.ok().filter(|x| x.is_finite()).ok_or(()))
            .collect::<Result<Vec<_>, _>>()
            .ok();
        match parts.as_deref() {
            Some(&[f, b]) => Ok(StageCost::new(f, b, None)?),
            Some(&[f, b, w]) => Ok(StageCost::new(f, b, Some(w))?),
            _ => bail!(
                "--cost `{text}`: expected two or three finite numbers F,B[,W], e.g. 1,2 or 1,2,1"
            ),
        }
    }
}

/// Where the model's tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory, CPU kernels.
    Cpu,
    /// GPU `N` (feature `cuda`).
    Cuda(usize),
}

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
pub fn parse_device(s: &str) -> std::result::Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("`{s}` is not a device: use cpu, cuda or cuda:N")),
    }
}

/// What the matmuls read and the activations are stored as (`train --precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// Everything in f32.
    F32,
    /// Matmul inputs rounded to TF32 (10 mantissa bits), f32 accumulation.
    Tf32,
    /// Matmul inputs in bf16 with f32 accumulation, activations and pipeline hand-offs in
    /// bf16; f32 master weights, gradients and AdamW moments.
    Bf16,
}

impl From<PrecisionArg> for pipewright::schedule::plan::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::F32 => Self::F32,
            PrecisionArg::Tf32 => Self::Tf32,
            PrecisionArg::Bf16 => Self::Bf16,
        }
    }
}

/// How ranks talk to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Every rank a thread of this process.
    Local,
    /// One process per rank over MPI: launch with `mpirun -np <pp*tp*dp>` (build with
    /// `--features mpi`).
    Mpi,
    /// One process per GPU, tensors over NCCL, control over MPI: launch with
    /// `mpirun -np <pp*tp*dp>`, each rank on the GPU of its local rank (build with
    /// `--features "nccl mpi"`).
    Nccl,
}

/// An MPI universe in this build: the real one with MPI, else a type with no values.
#[cfg(feature = "mpi")]
pub type MpiUniverse = pipewright::runtime::comm::mpi::Universe;
/// An MPI universe in this build: the real one with MPI, else a type with no values.
#[cfg(not(feature = "mpi"))]
pub type MpiUniverse = std::convert::Infallible;

/// The MPI universe of an NCCL run, when this binary has both; one clear error when not.
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub fn nccl_universe() -> Result<MpiUniverse> {
    mpi_universe()
}

/// The MPI universe of an NCCL run, when this binary has both; one clear error when not.
#[cfg(not(all(feature = "nccl", feature = "mpi")))]
pub fn nccl_universe() -> Result<MpiUniverse> {
    bail!("--transport nccl needs a pipewright built with NCCL and MPI; rebuild with: cargo build --release --features \"nccl mpi\" (needs OpenMPI; CUDA and NCCL are loaded at run time)")
}

/// The MPI universe, when this binary has MPI; one clear error when it does not.
#[cfg(feature = "mpi")]
pub fn mpi_universe() -> Result<MpiUniverse> {
    Ok(pipewright::runtime::comm::mpi::init()?)
}

/// The MPI universe, when this binary has MPI; one clear error when it does not.
#[cfg(not(feature = "mpi"))]
pub fn mpi_universe() -> Result<MpiUniverse> {
    bail!("--transport mpi: this pipewright was built without MPI; rebuild with MPI: cargo build --release --features mpi (needs OpenMPI)")
}

/// A timetable the flags made, validated once for every consumer; refused in the words the
/// simulator used when it validated it itself.
pub fn checked(tt: Timetable) -> Result<Checked> {
    Ok(Checked::new(tt).map_err(pipewright::sim::SimError::from)?)
}
