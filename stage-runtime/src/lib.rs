//! The per-device stage runtime: executes any valid timetable with real tensors.
//!
//! A [`Mesh`] of `pp x tp x dp` ranks runs a lowered timetable: rank `(pp, tp, dp)` executes
//! row `pp` with its TP shard of those stages, exchanging activations and gradients with the
//! ranks of the same `(tp, dp)` on neighbouring pipeline devices, all-reducing inside its TP
//! group within layers and over its DP group after each stage's last backward. Every rank is
//! an OS thread with a current-thread tokio runtime; the in-process [`LocalWorld`] connects
//! them. A failure anywhere stops every rank with one error naming rank, action and microbatch.
//!
//! ```
//! use pipewright_kernels::gpt::GptConfig;
//! use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
//! use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
//!
//! // 2 pipeline stages, 1F1B over 4 microbatches, 3 steps of a tiny GPT.
//! let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None)?;
//! let cfg = TrainConfig {
//!     mesh: Mesh::new(2, 1, 1)?,
//!     model: GptConfig::new(16, 8, 16, 2, 2),
//!     microbatch_size: 2,
//!     seed: 7,
//!     run: RunOptions { steps: 3, ..RunOptions::default() },
//! };
//! let mut losses = Vec::new();
//! train_gpt(&cfg, &generate(&spec), |s| losses.push(s.loss.unwrap()))?;
//! assert_eq!(losses.len(), 3);
//! assert!(losses[2] < losses[0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod comm;
pub mod data;
pub mod error;
pub mod executor;
pub mod host;
pub mod local_gpu;
pub mod mesh;
pub mod module;
pub mod run;
#[cfg(feature = "mpi")]
pub mod run_mpi;
#[cfg(feature = "nccl")]
pub mod run_nccl;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub mod run_nccl_mpi;
pub mod split;
pub mod train;

pub use batch::{MicrobatchId, StepBatch};
#[cfg(feature = "cuda")]
pub use comm::cuda_local::run_cuda_local;
pub use comm::local::{HostOps, LocalComm, LocalOps, LocalWorld};
pub use comm::{CommError, Communicator, Direction, ReduceOp, Tag};
pub use data::TokenBatch;
pub use error::RuntimeError;
pub use executor::{Executor, StepOutcome};
pub use local_gpu::{choose_gpu, GpuChoiceError};
pub use mesh::{Coord, Group, GroupKind, Mesh, MeshError};
pub use module::{GptModule, MicrobatchData, ModuleError, Output, StageModule, SyntheticModule};
pub use run::{prepare, run, run_local, FinalParams, RunOptions, StepRecord};
#[cfg(feature = "mpi")]
pub use run_mpi::run_mpi;
#[cfg(feature = "nccl")]
pub use run_nccl::run_nccl_rank;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub use run_nccl_mpi::run_nccl_mpi;
#[cfg(feature = "cuda")]
pub use train::train_gpt_cuda;
#[cfg(feature = "mpi")]
pub use train::train_gpt_mpi;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub use train::train_gpt_nccl_mpi;
#[cfg(feature = "nccl")]
pub use train::train_gpt_nccl_rank;
pub use train::{gpt_data, train_gpt, TrainConfig};
