//! Tensors, CPU and CUDA kernels with backward, and the layers of a small GPT.
//!
//! Not built yet: see issue 4.
#![deny(missing_docs)]
