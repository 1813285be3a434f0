//! Access for code that moves device tensors between streams and ranks (the runtime's
//! CUDA-local and NCCL transports): the raw slice and stream behind a tensor and a backend,
//! a tensor from a slice, and a backend on a new stream of the same GPU.
//!
//! Kept apart from the backend's ops so the two can change independently; nothing here
//! launches a kernel.

/// The driver types these accessors speak in, for crates that order work with events.
pub use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError};

use super::{cuda_err, CudaBackend, CudaTensor};
use cudarc::cublas::CudaBlas;
use pipewright_kernels_core::error::{shape_err, Result};
use std::sync::Arc;

impl CudaTensor {
    /// A tensor of `shape` over `data`, which must hold at least `max(numel, 1)` values (an
    /// empty tensor keeps one placeholder element, see [`CudaTensor`]) and start 16-byte
    /// aligned, as every cudarc allocation does: the row kernels read rows as float4.
    pub fn from_slice(shape: &[usize], data: CudaSlice<f32>) -> Result<Self> {
        let numel: usize = shape.iter().product();
        if data.len() < numel.max(1) {
            return Err(shape_err(
                "CudaTensor::from_slice",
                format!("{} values for shape {shape:?}", data.len()),
            ));
        }
        Ok(Self {
            shape: shape.to_vec(),
            data,
        })
    }

    /// The device memory (it may hold one more element than `numel` when empty).
    pub fn slice(&self) -> &CudaSlice<f32> {
        &self.data
    }

    /// The device memory, to write.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.data
    }

    /// The shape and the device memory.
    pub fn into_parts(self) -> (Vec<usize>, CudaSlice<f32>) {
        (self.shape, self.data)
    }
}

impl CudaBackend {
    /// The stream all of this backend's work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// A backend on a new stream of the same GPU and context (its own cuBLAS handle; the
    /// kernels, loaded in that context, are shared), so several ranks can share one GPU with
    /// their work ordered independently. Creating a second stream turns on cudarc's
    /// per-slice event tracking for the context.
    pub fn on_new_stream(&self) -> Result<Self> {
        let stream = self.context().new_stream().map_err(cuda_err)?;
        Ok(Self {
            ordinal: self.ordinal,
            blas: CudaBlas::new(stream.clone()).map_err(cuda_err)?,
            kernels: self.kernels.clone(),
            rows: self.rows.clone(),
            attn: self.attn.clone(),
            rotary: self.rotary.clone(),
            mixed: self.mixed.clone(),
            precision: self.precision,
            stream,
        })
    }
}
