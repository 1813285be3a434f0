//! Kept tensors on the GPU ([`pipewright_kernels_core::kept`]): the f32 tensor itself in f32 and tf32 runs, a
//! bf16 copy in a bf16 run (`mixed.rs`'s `to_bf16`, the same rounding as the host's), widened
//! back by `from_bf16` when a backward reads it.

use super::tensor::CudaKept;
use super::{CudaBackend, CudaTensor};
use cudarc::driver::CudaSlice;
use half::bf16;
use pipewright_kernels_core::backend::Restored;
use pipewright_kernels_core::error::Result;
use pipewright_kernels_core::precision::PrecisionExt;
use pipewright_kernels_core::tensor::DType;

impl CudaBackend {
    /// A zeroed kept tensor of `shape` in `dtype` (f32 or bf16): a buffer to receive a
    /// tensor sent in kept form (the NCCL transport's bf16 hand-offs).
    pub fn kept_zeros(&self, shape: &[usize], dtype: DType) -> Result<CudaKept> {
        match dtype {
            DType::BF16 => {
                let n = shape.iter().product::<usize>().max(1);
                let data = self
                    .stream
                    .alloc_zeros::<bf16>(n)
                    .map_err(super::cuda_err)?;
                Ok(CudaKept::Bf16 {
                    shape: shape.to_vec(),
                    data,
                })
            }
            DType::F32 => Ok(CudaKept::F32(self.zeros(shape)?)),
            DType::F16 => Err(pipewright_kernels_core::KernelError::Config(
                "f16 is not a kept format (f32 or bf16)".into(),
            )),
        }
    }

    /// `t` kept in the activation format of the backend's precision.
    pub(super) fn keep_tensor(&self, t: CudaTensor) -> Result<CudaKept> {
        match self.precision.activation_dtype() {
            DType::BF16 => {
                let data = self.mixed.to_bf16(&self.stream, &t)?;
                // Freed in stream order, after the conversion has read it.
                Ok(CudaKept::Bf16 {
                    shape: t.shape.clone(),
                    data,
                })
            }
            DType::F32 | DType::F16 => Ok(CudaKept::F32(t)),
        }
    }

    /// A kept tensor as f32: lent, or widened into a new tensor.
    pub(super) fn restore_tensor<'a>(&self, k: &'a CudaKept) -> Result<Restored<'a, CudaTensor>> {
        match k {
            CudaKept::F32(t) => Ok(Restored::Same(t)),
            CudaKept::Bf16 { shape, data } => Ok(Restored::Widened(self.widen(shape, data)?)),
        }
    }

    /// [`Self::restore_tensor`] by value.
    pub(super) fn restore_tensor_owned(&self, k: CudaKept) -> Result<CudaTensor> {
        match k {
            CudaKept::F32(t) => Ok(t),
            CudaKept::Bf16 { shape, data } => self.widen(&shape, &data),
        }
    }

    fn widen(&self, shape: &[usize], data: &CudaSlice<bf16>) -> Result<CudaTensor> {
        let mut out = self.zeros(shape)?;
        self.mixed.widen_bf16(&self.stream, data, &mut out)?;
        Ok(out)
    }
}
