//! Tensors, CPU (and optionally CUDA) kernels with backward, and the layers
//! of a small GPT with tensor-parallel splits: the real work that
//! pipewright's runtime schedules.
//!
//! # Map
//! - [`Tensor`]: a contiguous row-major f32 tensor on the CPU, with bf16/f16
//!   and byte conversions ([`DType`]) for storage and transfer.
//! - [`backend`]: the [`Backend`] trait alone (and the words it speaks); it knows no backend.
//! - [`cpu`]: the host backend [`Cpu`](struct@Cpu) and its ops, each with its backward:
//!   strided-sgemm matmul (no transposes are ever copied), bias add, GeLU (tanh form),
//!   LayerNorm, softmax cross-entropy, embedding, causal attention, residual add; its own
//!   AdamW update.
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
//! - [`Precision`]: f32, TF32 or bf16 matmul inputs (f32 accumulation) and bf16 stored
//!   activations, a property of a backend; the host backend emulates the reduced ones.
//! - [`Backend`]: the ops the layers run on; layers and
//!   [`gpt::GptStage`] are generic over it ([`Cpu`] by default).
//! - `cuda` (cargo feature `cuda`): the same ops on a GPU through cuBLAS and
//!   NVRTC, with its own AdamW kernel; it checks for the CUDA libraries before its first call.
//! - [`Footprint`] and [`kept`]: leaves below the backends (a backend implements them for its
//!   own types; they import no backend).
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

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod footprint;
pub mod gpt;
pub mod init;
pub mod kept;
pub mod layers;
pub mod optim;
pub mod params;
pub mod precision;
pub mod tensor;

pub use backend::{Backend, Shaped};
pub use cpu::Cpu;
pub use error::{KernelError, Result};
pub use footprint::Footprint;
/// `#[derive(Footprint)]`: a stash's bytes as the sum of its fields' (see [`pipewright_derive`]).
pub use pipewright_derive::Footprint;
pub use precision::Precision;
pub use tensor::{DType, Tensor};
