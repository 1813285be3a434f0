//! The GPU itself: whether CUDA is here ([`missing_library`], [`device_count`]) and
//! [`CudaBackend`], one opened device with its stream, cuBLAS handle and compiled kernels.

use super::{
    attention, blas, cuda_err, kernels, mixed, param_shape, rotary, rowops, same_shape,
    CudaNormStash, CudaTensor,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use pipewright_kernels_core::backend::Restored;
use pipewright_kernels_core::error::{shape_err, KernelError, Result};
use pipewright_kernels_core::precision::Precision;
use std::sync::Arc;

/// Why CUDA cannot be used here, or `None` if its libraries are present.
pub fn missing_library() -> Option<&'static str> {
    // SAFETY: these only try to dlopen the libraries; no CUDA call is made.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Some("the CUDA driver library (libcuda) is not present");
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Some("the NVRTC library is not present");
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Some("the cuBLAS library is not present");
        }
    }
    None
}

/// GPUs the driver sees, or [`KernelError::CudaUnavailable`] where a library is missing
/// (checked before any CUDA call, which would panic without it).
pub fn device_count() -> Result<usize> {
    if let Some(why) = missing_library() {
        return Err(KernelError::CudaUnavailable(why.into()));
    }
    let n = CudaContext::device_count()
        .map_err(|e| KernelError::CudaUnavailable(format!("no usable device: {e:?}")))?;
    Ok(n.max(0) as usize)
}

/// GPU `ordinal` for a test, or `None` after printing `skipped: <why>` where CUDA is absent
/// (no library, no device): the one skip rule every GPU test follows.
///
/// # Panics
/// Where CUDA is present but the backend fails to build (an NVRTC compile, a cuBLAS handle):
/// a broken GPU path must fail its tests, not skip them.
pub fn gpu_for_tests(ordinal: usize) -> Option<CudaBackend> {
    match CudaBackend::new(ordinal) {
        Ok(gpu) => Some(gpu),
        Err(e @ KernelError::CudaUnavailable(_)) => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("CUDA is present but its backend failed: {e}"),
    }
}

/// One GPU: its context, a stream, a cuBLAS handle and the compiled kernels.
/// All work is queued on the one stream, so it runs in call order.
pub struct CudaBackend {
    pub(super) ordinal: usize,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    pub(super) kernels: kernels::Kernels,
    pub(super) rows: rowops::RowKernels,
    pub(super) attn: attention::AttnKernels,
    pub(super) rotary: rotary::RotaryKernels,
    /// f32 to bf16 conversions for reduced-precision matmuls and activations.
    pub(super) mixed: mixed::MixedKernels,
    pub(super) precision: Precision,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend(cuda:{})", self.ordinal)
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal` and compiles the kernels; errors with
    /// [`KernelError::CudaUnavailable`] if a library or the device is missing.
    pub fn new(ordinal: usize) -> Result<Self> {
        if let Some(why) = missing_library() {
            return Err(KernelError::CudaUnavailable(why.into()));
        }
        let count = CudaContext::device_count()
            .map_err(|e| KernelError::CudaUnavailable(format!("no usable device: {e:?}")))?;
        if ordinal as i64 >= count as i64 {
            return Err(KernelError::CudaUnavailable(format!(
                "device {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(cuda_err)?;
        let kernels = kernels::Kernels::compile(&ctx)?;
        let rows = rowops::RowKernels::compile(&ctx)?;
        let attn = attention::AttnKernels::compile(&ctx)?;
        Ok(Self {
            ordinal,
            stream,
            blas,
            kernels,
            rows,
            attn,
            rotary: rotary::RotaryKernels::compile(&ctx)?,
            mixed: mixed::MixedKernels::compile(&ctx)?,
            precision: Precision::F32,
        })
    }

    /// This backend computing in `precision` (f32 by default): TF32 tensor-core math on the
    /// f32 operands, or bf16 copies of them (f32 accumulation and output either way), and
    /// bf16-rounded activations in a bf16 run. Activations keep f32 storage: the values
    /// are bf16, the memory is not halved.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Runs a product of `first` and `second` (the matmul's two tensor arguments, in
    /// order) with the operands this backend's precision reads.
    pub(super) fn with_reads<T>(
        &self,
        first: &CudaTensor,
        second: &CudaTensor,
        product: impl FnOnce(&blas::Reads<'_>) -> Result<T>,
    ) -> Result<T> {
        match self.precision {
            Precision::F32 => product(&blas::Reads::F32),
            Precision::Tf32 => product(&blas::Reads::Tf32),
            Precision::Bf16 => {
                // Freed after the product is queued: the allocator orders the frees on
                // the stream, behind the GEMM that reads them.
                let a = self.mixed.to_bf16(&self.stream, first)?;
                let b = self.mixed.to_bf16(&self.stream, second)?;
                product(&blas::Reads::Bf16(&a, &b))
            }
        }
    }

    /// A zero tensor on the device.
    pub fn zeros(&self, shape: &[usize]) -> Result<CudaTensor> {
        let data = self
            .stream
            .alloc_zeros::<f32>(shape.iter().product::<usize>().max(1))
            .map_err(cuda_err)?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Copies host ids or targets to the device.
    pub(super) fn upload_ids(&self, ids: &[u32]) -> Result<CudaSlice<u32>> {
        if ids.is_empty() {
            // No zero-byte allocations (see `CudaTensor`); nothing reads it.
            return self.stream.alloc_zeros::<u32>(1).map_err(cuda_err);
        }
        self.stream.clone_htod(ids).map_err(cuda_err)
    }

    /// The GPU's name as the driver reports it (e.g. "NVIDIA H100 80GB HBM3").
    pub fn device_name(&self) -> Result<String> {
        self.stream.context().name().map_err(cuda_err)
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }

    /// A norm's `x̂` as its input backward reads it, after checking the stash against the
    /// output gradient `dy` and the scale (a stash is public, so its parts may not match).
    pub(super) fn norm_stash_for<'a>(
        &self,
        op: &'static str,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        stash: &'a CudaNormStash,
    ) -> Result<Restored<'a, CudaTensor>> {
        param_shape(op, dy, gamma)?;
        let xhat = self.restore_tensor(&stash.xhat)?;
        same_shape(op, dy, &xhat)?;
        if stash.rstd.shape != [dy.rows()] {
            return Err(shape_err(
                op,
                format!("rstd {:?} for {:?}", stash.rstd.shape, dy.shape),
            ));
        }
        Ok(xhat)
    }
}
