//! The layers of a small GPT with split backward and tensor-parallel splits, the reference
//! GPT and its optimizers, over the kernels of `pipewright-kernels-core` (re-exported here
//! under their old paths, so `pipewright_kernels::cpu`, `::Tensor` and `::Backend` still
//! work) and, with feature `cuda`, the GPU backend of `pipewright-kernels-cuda` as `cuda`.
//!
//! # Map
//! - [`Tensor`], [`backend`], [`cpu`], [`Precision`], [`Footprint`], [`kept`], [`init`]: re-exported
//!   from `pipewright-kernels-core` (see its map).
//! - [`layers`]: `Linear`, column/row-parallel linears, head-split attention,
//!   the MLP, the pre-norm block and the LM head. Every layer with weights
//!   splits its backward into an input part (I) and a weight part (W), with
//!   stashes in between, because zero-bubble schedules run them apart.
//!   Tensor parallelism needs an all-reduce, which the runtime supplies
//!   through the [`layers::TpReduce`] trait; kernels never communicate.
//! - [`gpt`]: the reference GPT, built whole or as any stage of a pipeline
//!   and any TP rank, with identical numbers from one seed ([`init`]).
//! - [`optim`]: SGD with momentum and AdamW over the flat parameter view,
//!   and [`optim::DeviceAdamW`], AdamW on any backend's tensors.
//! - [`params`]: flat gradients, their reset and host copies of parameters
//!   on any backend (what a runtime needs around the optimizer step).
//! - `cuda` (cargo feature `cuda`): the same ops on a GPU through cuBLAS and
//!   NVRTC, with its own AdamW kernel; it checks for the CUDA libraries before its first call.
//!
//! # Invariants
//! - No op is implemented here: layers call a [`Backend`]'s methods, so the core crate and
//!   the CUDA crate never depend on this one.
//! - No CUDA type is named outside the `cuda` re-export: layers, the GPT and the optimizers
//!   are generic over [`Backend`] and compile the same with and without feature `cuda`.
//! - No communication: tensor parallelism reaches other ranks only through the runtime's
//!   [`layers::TpReduce`].
//!
//! # A pipeline of two stages, by hand
//! A runtime does the following per microbatch, with the stashes kept per
//! microbatch and I and W of a backward free to run at different times:
//!
//! ```
//! use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, StageOutput};
//! use pipewright_kernels::layers::{NoTp, Parameters, TpShard};
//! use pipewright_kernels::optim::{AdamW, AdamWConfig};
//!
//! let cfg = GptConfig::new(16, 8, 32, 4, 2); // vocab, seq, d_model, heads, layers
//! let mut s0 = GptStage::new(&cfg, 7, 0, 2, TpShard::SINGLE)?;
//! let mut s1 = GptStage::new(&cfg, 7, 1, 2, TpShard::SINGLE)?;
//! let tokens: Vec<u32> = (0..16).map(|i| i % 16).collect();
//! let targets: Vec<u32> = tokens.iter().map(|t| (t + 1) % 16).collect();
//! let mb = Microbatch { tokens: &tokens, targets: &targets, seq: 8, loss_scale: 1.0 };
//!
//! // F on stage 0, then on stage 1 (which returns the loss).
//! let (StageOutput::Hidden(h), stash0) = s0.forward(&mb, None, &mut NoTp)? else { panic!() };
//! let (StageOutput::Loss(loss), stash1) = s1.forward(&mb, Some(h), &mut NoTp)? else { panic!() };
//! assert!((loss - 16f32.ln()).abs() < 0.5);
//!
//! // I on stage 1 sends a gradient back; its W can wait.
//! let (grad, w1) = s1.backward_input(stash1, None, &mut NoTp)?;
//! let grad0 = s0.backward(stash0, grad, &mut NoTp)?; // B = I then W
//! assert!(grad0.is_none()); // token ids have no gradient
//! s1.backward_weight(w1)?;
//!
//! for stage in [&mut s0, &mut s1] {
//!     let mut opt = AdamW::new(stage.num_params(), AdamWConfig::default());
//!     opt.step(stage)?;
//!     stage.zero_grad();
//! }
//! # Ok::<(), pipewright_kernels::KernelError>(())
//! ```
#![deny(missing_docs)]

pub use pipewright_kernels_core::{
    backend, cpu, error, float16, footprint, init, kept, precision, tensor,
};
/// The CUDA backend (cargo feature `cuda`): the crate `pipewright-kernels-cuda`.
#[cfg(feature = "cuda")]
pub use pipewright_kernels_cuda as cuda;
pub mod gpt;
pub mod layers;
pub mod optim;
pub mod params;

pub use backend::{Backend, Shaped};
pub use cpu::Cpu;
pub use error::{KernelError, Result};
pub use float16::{Bf16, F16};
pub use footprint::Footprint;
/// `#[derive(Footprint)]`: a stash's bytes as the sum of its fields' (see [`pipewright_derive`]).
pub use pipewright_derive::Footprint;
pub use precision::{Precision, PrecisionExt};
pub use tensor::{DType, Tensor};
