//! What a user implements for one chunk of a model, and the stages built on it: the
//! [`StageModule`] trait, a model as a list of layers cut into stages ([`split`]), the host
//! parameter helpers ([`host`]) and the candle bridge (`candle`, feature `candle`).
//!
//! The runtime (`pipewright-runtime`) runs any [`StageModule`] over a timetable and a mesh;
//! this crate is what it runs. Invariants, as absences:
//! - a stage does not know ranks, meshes, communicators or timetables: it computes one
//!   microbatch's forward and backward and keeps its own parameters, and the runtime decides
//!   when, where and with which tensors;
//! - nothing here depends on the runtime (`pipewright-runtime` depends on this crate, never
//!   the reverse), so a stage compiles without the executor or any transport.
#![deny(missing_docs)]

mod boxed;
#[cfg(feature = "candle")]
pub mod candle;
pub mod host;
pub mod module;
mod param_name;
pub mod split;

/// The kernels crate, whose types [`StageModule`] and [`split::Layer`] use.
pub use pipewright_kernels as kernels;
pub use pipewright_kernels::layers::{NoTp, Param, Parameters, TpReduce};
pub use pipewright_kernels::{Footprint, Shaped, Tensor};

pub use module::{MicrobatchData, ModuleError, Output, ParamName, StageModule, Unimplemented};
