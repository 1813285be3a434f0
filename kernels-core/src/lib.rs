//! The core of pipewright's kernels: host tensors, the [`Backend`] trait and the CPU backend,
//! each op with its backward. The layers and the reference GPT (`pipewright-kernels`) and the
//! CUDA backend (`pipewright-kernels-cuda`) are built over it.
//!
//! # Map
//! - [`Tensor`]: a contiguous row-major f32 tensor on the CPU, with bf16/f16
//!   and byte conversions ([`DType`]) for storage and transfer.
//! - [`backend`]: the [`Backend`] trait alone (and the words it speaks); it knows no backend.
//! - [`cpu`]: the host backend [`Cpu`](struct@Cpu) and its ops, each with its backward:
//!   strided-sgemm matmul (no transposes are ever copied), bias add, GeLU (tanh form),
//!   LayerNorm, softmax cross-entropy, embedding, causal attention, residual add; its own
//!   AdamW update.
//! - [`Precision`]: f32, TF32 or bf16 matmul inputs (f32 accumulation) and bf16 stored
//!   activations, a property of a backend; the host backend emulates the reduced ones.
//! - [`init`]: seeded initial values, the same on every backend, stage and rank.
//! - [`Footprint`] and [`kept`]: leaves below the backends (a backend implements them for its
//!   own types; they import no backend).
//!
//! # Invariants
//! - No layer, model or optimizer lives here: the crate does not depend on
//!   `pipewright-kernels`, so a backend needs only this crate to implement [`Backend`].
//! - No CUDA: nothing here links cudarc or names a GPU type; the GPU backend implements
//!   the same trait from its own crate.
//! - No communication: an op reads and writes its own tensors only.
#![deny(missing_docs)]

pub mod backend;
pub mod cpu;
pub mod error;
pub mod float16;
pub mod footprint;
pub mod init;
pub mod kept;
pub mod precision;
pub mod tensor;

pub use backend::{Backend, Shaped};
pub use cpu::Cpu;
pub use error::{KernelError, Result};
pub use float16::{Bf16, F16};
pub use footprint::Footprint;
pub use precision::{Precision, PrecisionExt};
pub use tensor::{DType, Tensor};
