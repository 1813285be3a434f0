//! The per-device stage runtime: executes any valid timetable with real tensors.
//!
//! A [`Mesh`] of `pp x tp x dp` ranks runs a lowered timetable: rank `(pp, tp, dp)` executes
//! row `pp` with its TP shard of those stages, exchanging activations and gradients with the
//! ranks of the same `(tp, dp)` on neighbouring pipeline devices, all-reducing inside its TP
//! group within layers and over its DP group after each stage's last backward. Every rank is
//! an OS thread with a current-thread tokio runtime; the in-process [`LocalWorld`] connects
//! them. A failure anywhere stops every rank with one error naming rank, action and microbatch.
//! With [`Mesh::with_ep`], a mixture of experts' experts are sharded over `ep` adjacent DP
//! replicas (Megatron-Core's parallel folding, expert TP 1): the mixtures all-to-all their rows
//! over that EP group ([`Communicator::all_to_all`]), the experts' gradients are summed over
//! the replicas holding the same experts and the rest over every replica
//! ([`StageModule::expert_ranges`] says which are which), and the final parameters gather every
//! replica's experts.
//!
//! Any model cut into stages trains through it: a user implements [`StageModule`] for a
//! stage (forward, and a backward split into input and weight parts, or only a full one) with
//! its own microbatch type [`StageModule::Data`], and gives [`run()`] a function building a
//! stage's module and one building a microbatch (on each rank, never sent). Here a model of
//! two scalar weights, `y = w1 * w0 * x`, learns `y = 2x` on two pipeline devices:
//!
//! ```
//! use pipewright_kernels::layers::TpReduce;
//! use pipewright_kernels::optim::AdamWConfig;
//! use pipewright_kernels::Tensor;
//! use pipewright_runtime::{run, Mesh, MicrobatchData, MicrobatchId, ModuleError, Output, RunOptions, StageModule};
//! use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
//!
//! /// One stage: `y = w * x`; the last one's loss is the mean squared error.
//! struct Scale { w: f32, grad: f32, last: bool }
//!
//! impl StageModule for Scale {
//!     type Tensor = Tensor;
//!     type Data = (Vec<f32>, Vec<f32>); // inputs, targets
//!     type Stash = (Tensor, Option<Tensor>); // input, loss gradient
//!     type WeightStash = (Tensor, Tensor); // input, output gradient
//!
//!     fn forward(&mut self, mb: &MicrobatchData<'_, Self::Data>, input: Option<Tensor>, _: &mut dyn TpReduce)
//!         -> Result<(Output, Self::Stash), ModuleError> {
//!         let x = input.unwrap_or(Tensor::new(&[mb.data.0.len()], mb.data.0.clone())?);
//!         let y: Vec<f32> = x.data().iter().map(|v| self.w * v).collect();
//!         if !self.last {
//!             return Ok((Output::Hidden(Tensor::new(&[y.len()], y)?), (x, None)));
//!         }
//!         let s = mb.loss_scale / y.len() as f32;
//!         let err: Vec<f32> = y.iter().zip(&mb.data.1).map(|(y, t)| y - t).collect();
//!         let loss = s * err.iter().map(|e| e * e).sum::<f32>();
//!         let grad = Tensor::new(&[y.len()], err.iter().map(|e| 2.0 * s * e).collect())?;
//!         Ok((Output::Loss(loss), (x, Some(grad))))
//!     }
//!
//!     fn backward_input(&mut self, (x, dloss): Self::Stash, dy: Option<Tensor>, _: &mut dyn TpReduce)
//!         -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
//!         let dy = dy.or(dloss).ok_or("no gradient")?;
//!         let dx: Vec<f32> = dy.data().iter().map(|d| self.w * d).collect();
//!         Ok((Some(Tensor::new(&[dx.len()], dx)?), (x, dy)))
//!     }
//!
//!     fn backward_weight(&mut self, (x, dy): Self::WeightStash) -> Result<(), ModuleError> {
//!         self.grad += x.data().iter().zip(dy.data()).map(|(x, d)| x * d).sum::<f32>();
//!         Ok(())
//!     }
//!
//!     fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
//!         self.w -= cfg.lr * self.grad; // plain SGD: the module owns its optimizer
//!         self.grad = 0.0;
//!         Ok(())
//!     }
//! }
//!
//! // Microbatch `id` of each step: 4 points of y = 2x, built on every rank of its replica.
//! let data = |id: MicrobatchId| -> Result<_, ModuleError> {
//!     let x: Vec<f32> = (0..4).map(|i| (id.global() + i) as f32 / 8.0).collect();
//!     Ok((x.clone(), x.iter().map(|x| 2.0 * x).collect()))
//! };
//! // Validated once: `run` takes the timetable as `Checked` and does not check it again.
//! let tt = Checked::new(generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None)?))?;
//! let opts = RunOptions { steps: 20, adamw: AdamWConfig { lr: 0.5, ..Default::default() }, ..Default::default() };
//! let mut losses = Vec::new();
//! run(
//!     Mesh::new(2, 1, 1)?,
//!     &tt,
//!     |_coord, stage| Ok(Scale { w: 0.5, grad: 0.0, last: stage == 1 }),
//!     data,
//!     &opts,
//!     |step| losses.push(step.loss.unwrap()),
//! )?;
//! assert!(losses[19] < losses[0] / 100.0, "{losses:?}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `run` on a mesh of one device is the reference every parallel run should equal: with
//! `dp` replicas of `m` microbatches, run the same modules' whole model as one stage on
//! `Mesh::new(1, 1, 1)` under `generate(&ScheduleSpec::new(ScheduleKind::GPipe, 1, 1, dp *
//! m, None)?)`: the same global batch ([`MicrobatchId::global`]) and loss scale.
//!
//! The runtime checks the module where it hands something over. Before the first step it
//! refuses, naming the stage and the method, a module that lacks a method the run's answer
//! depends on (`flat_grads` and `set_flat_grads` with more than one data-parallel replica;
//! see [`StageModule`]); at every hand-off it checks a forward's output and an input
//! gradient against the shapes they must have ([`RuntimeError::HandOff`]). In step 0 it
//! compares what every rank's data function built for each microbatch
//! ([`StageModule::data_fingerprint`]; its targets, through the loss, at the end of step 0:
//! [`StageModule::target_fingerprint`]) and, before the first optimizer step, refuses a named
//! parameter whose gradient stayed exactly zero ([`StageModule::parameter_names`],
//! [`RuntimeError::UnusedParameters`]).
//!
//! The reference GPT is one such user ([`GptModule`], [`train_gpt`]):
//!
//! ```
//! use pipewright_kernels::gpt::GptConfig;
//! use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
//! use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
//!
//! // 2 pipeline stages, 1F1B over 4 microbatches, 3 steps of a tiny GPT.
//! let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None)?;
//! let cfg = TrainConfig {
//!     mesh: Mesh::new(2, 1, 1)?,
//!     model: GptConfig::new(16, 8, 16, 2, 2),
//!     microbatch_size: 2,
//!     sequence_parallel: false,
//!     seed: 7,
//!     run: RunOptions { steps: 3, ..RunOptions::default() },
//! };
//! let mut losses = Vec::new();
//! train_gpt(&cfg, &Checked::new(generate(&spec))?, |s| losses.push(s.loss.unwrap()))?;
//! assert_eq!(losses.len(), 3);
//! assert!(losses[2] < losses[0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod data;
mod erase;
pub mod error;
pub mod executor;
pub mod local_gpu;
pub mod memory;
pub mod module;
pub mod options;
pub mod report;
pub mod run;
#[cfg(feature = "cuda")]
pub mod run_cuda;
#[cfg(feature = "mpi")]
pub mod run_mpi;
#[cfg(feature = "nccl")]
pub mod run_nccl;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub mod run_nccl_mpi;
mod setup;
pub mod shape;
pub mod train;
pub mod train_request;
pub mod zero;

// What moved to the crates below the runtime keeps its paths here.
/// The transports (`pipewright-comm`): the [`Communicator`] trait, in-process, MPI, NCCL and
/// CUDA-local.
pub use pipewright_comm as comm;
pub use pipewright_comm::mesh;
#[cfg(feature = "candle")]
pub use pipewright_stage::candle;
pub use pipewright_stage::{host, split};

/// The kernels crate, whose types [`StageModule`] and [`split::Layer`] use.
pub use pipewright_kernels as kernels;
pub use pipewright_kernels::gpt::StageOutput;
pub use pipewright_kernels::layers::{NoTp, Param, Parameters, TpReduce};
pub use pipewright_kernels::optim::AdamWConfig;
pub use pipewright_kernels::{Footprint, Shaped, Tensor};
pub use pipewright_schedule::Recompute;

pub use batch::{MicrobatchId, StepBatch};
pub use comm::local::{HostOps, LocalComm, LocalOps, LocalWorld};
pub use comm::{shard_range, CommError, Communicator, Direction, ReduceOp, Tag};
pub use data::TokenBatch;
pub use error::RuntimeError;
pub use executor::{Executor, StepOutcome};
pub use local_gpu::{choose_gpu, GpuChoiceError};
pub use memory::{DeviceMemory, RankMemory};
pub use mesh::{Coord, Group, GroupKind, Mesh, MeshError};
pub use module::{
    GptModule, MicrobatchData, ModuleError, Output, ParamName, StageModule, SyntheticModule,
    Unimplemented,
};
pub use options::RunOptions;
pub use report::{StepReport, StepReportError};
pub use run::{prepare, run, run_local, FinalParams, StepRecord};
#[cfg(feature = "cuda")]
pub use run_cuda::run_cuda_local;
#[cfg(feature = "mpi")]
pub use run_mpi::run_mpi;
#[cfg(feature = "nccl")]
pub use run_nccl::run_nccl_rank;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub use run_nccl_mpi::run_nccl_mpi;
pub use shape::gpt_config;
#[cfg(feature = "cuda")]
pub use train::train_gpt_cuda;
#[cfg(feature = "mpi")]
pub use train::train_gpt_mpi;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub use train::train_gpt_nccl_mpi;
#[cfg(feature = "nccl")]
pub use train::train_gpt_nccl_rank;
pub use train::{gpt_data, train_gpt, TrainConfig};
pub use train_request::{TrainRequest, TrainRequestError};
pub use zero::{Zero, ZeroError};
