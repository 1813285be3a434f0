//! The one error type of this crate.

/// Everything that can go wrong in a kernel, a layer or the reference model.
///
/// Shapes that come from users (model configs, token batches, tensors handed
/// in by a runtime) are checked and reported here; violated internal
/// invariants are programmer errors and panic with a message instead.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Two tensors (or a tensor and a layer) disagree on shape.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The operation that found the mismatch.
        op: &'static str,
        /// What was expected and what was found.
        detail: String,
    },
    /// A model or layer configuration that cannot be built.
    #[error("invalid config: {0}")]
    Config(String),
    /// A token id or target at or beyond the vocabulary size.
    #[error("token id {id} out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A pipeline stage was called with the wrong kind of input or gradient.
    #[error("stage {stage}: {detail}")]
    Stage {
        /// Index of the stage.
        stage: usize,
        /// What was wrong.
        detail: String,
    },
    /// A byte buffer that does not hold a whole tensor of the given dtype.
    #[error("byte buffer of {len} bytes does not hold {numel} elements of {dtype}")]
    Bytes {
        /// Buffer length in bytes.
        len: usize,
        /// Expected element count.
        numel: usize,
        /// Element type name.
        dtype: &'static str,
    },
    /// The tensor-parallel all-reduce supplied by the runtime failed.
    #[error("tensor-parallel all-reduce failed: {0}")]
    Reduce(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A CUDA library (driver, NVRTC, cuBLAS) or device is not present.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA call failed.
    #[error("CUDA error: {0}")]
    Cuda(String),
}

/// Result with [`KernelError`].
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// Shorthand for a [`KernelError::Shape`] (for the crates built on this one too).
pub fn shape_err(op: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::Shape {
        op,
        detail: detail.into(),
    }
}
