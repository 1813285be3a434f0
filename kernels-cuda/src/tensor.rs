//! The CUDA backend's storage: device tensors and what its norms and attention keep for
//! their backwards, with the bytes each holds ([`Footprint`]).

use cudarc::driver::CudaSlice;
use half::bf16;
use pipewright_kernels_core::backend::Shaped;
use pipewright_kernels_core::footprint::{Footprint, F32};
use pipewright_kernels_core::kept::Kept;

/// A device tensor as a stash keeps it: the f32 tensor, or a bf16 buffer of at least one
/// element (as every device allocation) with the shape that says how many are live.
pub type CudaKept = Kept<CudaTensor, CudaSlice<bf16>>;

/// A dense row-major f32 tensor in device memory.
///
/// The CUDA allocator rejects zero-byte allocations, so an empty tensor
/// still owns one (never read) element: the shape alone says how many
/// elements are live, and every kernel and copy goes by the shape.
#[derive(Debug)]
pub struct CudaTensor {
    pub(super) shape: Vec<usize>,
    pub(super) data: CudaSlice<f32>,
}

impl CudaTensor {
    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the last dimension.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Product of all dimensions but the last.
    pub fn rows(&self) -> usize {
        self.numel().checked_div(self.cols()).unwrap_or(0)
    }
}

impl Shaped for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

/// What a LayerNorm forward on the GPU saves for its backward.
#[derive(Debug)]
pub struct CudaNormStash {
    /// The normalised input `(x - mean) * rstd`, shape of `x`, kept like any activation.
    pub xhat: CudaKept,
    /// `1 / sqrt(var + eps)` per row, shape `[rows]`.
    pub rstd: CudaTensor,
}

/// What a causal attention forward on the GPU saves for its backward (with
/// its input and output): each row's logsumexp, from which the backward
/// recomputes the probabilities.
#[derive(Debug)]
pub struct CudaAttnStash {
    /// `log(sum_j exp(s_ij))` of the scaled, masked scores, `[batch, heads, seq]`.
    pub lse: CudaTensor,
}

impl Footprint for CudaTensor {
    fn bytes(&self) -> usize {
        self.numel() * F32
    }
}

impl Footprint for CudaNormStash {
    fn bytes(&self) -> usize {
        self.xhat.bytes() + self.rstd.bytes()
    }
}

impl Footprint for CudaAttnStash {
    fn bytes(&self) -> usize {
        self.lse.bytes()
    }
}
