//! Calibration: measure this machine as a [`Cluster`] for the planner (`pipewright plan
//! --calibrate FILE` writes it; `plan --cluster FILE` reads it back).
//!
//! - [`cpu`]: the CPU, one in-process device per core (what pipewright's in-process runs use).
//! - [`cuda`] (feature `cuda`): one GPU through the kernels' CUDA backend; one GPU cannot
//!   measure NVLink or InfiniBand, so the links come from a given cluster.
//!
//! Each measurement checks the results of the work it times, so none can be skipped.
//!
//! # Invariants
//! - No flag names: errors name what was measured; the CLI adds its own words.
//! - No file IO: a [`Calibration`] is returned; the caller writes it.
//! - No CUDA library touched without the feature `cuda`, and none before the backend has
//!   found it.
#![deny(missing_docs)]

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod timing;

use pipewright_kernels_core::KernelError;
use pipewright_plan::Cluster;

pub use cpu::cpu;
#[cfg(feature = "cuda")]
pub use cuda::cuda;

/// A measured machine: the cluster file's contents and one line saying what was measured.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// The machine as a cluster (check it with [`Cluster::check`] before writing it).
    pub cluster: Cluster,
    /// What was measured, for people.
    pub summary: String,
}

/// Why a calibration could not measure.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// A kernel failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A timed matmul or kernel gave a wrong result, so its time means nothing.
    #[error("calibration {what} gave a wrong result")]
    WrongResult {
        /// What was measured.
        what: String,
    },
    /// No rate could be fitted to the matmul samples.
    #[error("calibration measured no {what} matmul rate")]
    NoRate {
        /// Which precision (or the CPU's).
        what: String,
    },
    /// There is no GPU `cuda:N` to measure.
    #[error("cuda:{ordinal}: no GPU to measure: {why}")]
    NoGpu {
        /// The GPU asked for.
        ordinal: usize,
        /// What is missing.
        why: String,
    },
}
