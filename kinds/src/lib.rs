//! The words a model shape and a run are made of, defined once: the MLP's kind, the norm's
//! kind, which layers have biases, and the precision of a run. The kernels build layers from them, the memory model and
//! the planner count with them, and each face parses and prints them by the same names.
//!
//! # Invariants
//! - No second definition: `pipewright-model`, `pipewright-plan` and `pipewright-kernels`
//!   re-export these types under their old paths.
//! - No kernel or tensor: what a kind means to a backend (a gated unit's activation, the
//!   dtype an activation is stored in, rounding f32 values) lives in the kernels, as
//!   extension traits over these types.
//! - No flag names: the CLI maps its flags to these types; errors name the value and the
//!   kind, not a flag.
//! - Dependencies: serde only.
#![deny(missing_docs)]

mod precision;
mod shape;

pub use precision::Precision;
pub use shape::{BiasKind, MlpKind, NormKind};
