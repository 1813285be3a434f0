//! Tensors, CPU and CUDA kernels with backward, and the layers of a small GPT.
#![deny(missing_docs)]

pub mod cpu;
pub mod error;
pub mod tensor;

pub use error::{KernelError, Result};
pub use tensor::{DType, Tensor};
pub mod gpt;
pub mod init;
pub mod layers;
pub mod optim;
