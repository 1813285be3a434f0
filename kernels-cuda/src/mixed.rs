//! Reduced precision on the GPU: f32 to bf16 conversion of matmul operands (cuBLAS then
//! reads bf16 and accumulates in f32) and of kept activations (`kept.rs`), their widening
//! back to f32, and the rounding of stored activations to bf16.
//!
//! Both round to nearest even with the same bit arithmetic as `half::bf16::from_f32`, which
//! the host backend's emulation uses, so a bf16 value is the same on both.

use super::{cuda_err, CudaTensor};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use half::bf16;
use pipewright_kernels_core::error::{KernelError, Result};
use std::sync::Arc;

pub(super) const SOURCE: &str = r#"
// f32 bits to bf16 bits, round to nearest even; a NaN stays a (quiet) NaN.
__device__ unsigned short bf16_bits(float v) {
    unsigned int b = __float_as_uint(v);
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u) {
        return (unsigned short)((b >> 16) | 0x0040u);
    }
    b += 0x7fffu + ((b >> 16) & 1u);
    return (unsigned short)(b >> 16);
}
extern "C" __global__ void to_bf16(unsigned short* out, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_bits(x[i]);
}
extern "C" __global__ void from_bf16(float* out, const unsigned short* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __uint_as_float(((unsigned int)x[i]) << 16);
}
extern "C" __global__ void round_bf16(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __uint_as_float(((unsigned int)bf16_bits(x[i])) << 16);
}
"#;

/// The kernels the backend loads from [`SOURCE`].
pub(super) const NAMES: &[&str] = &["to_bf16", "from_bf16", "round_bf16"];

/// The compiled conversion kernels of one backend (cloned handles share the loaded module).
#[derive(Clone)]
pub(super) struct MixedKernels {
    to_bf16: CudaFunction,
    from_bf16: CudaFunction,
    round_bf16: CudaFunction,
}

fn len(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} elements exceed a kernel's int")))
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

impl MixedKernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let [to_bf16, from_bf16, round_bf16]: [CudaFunction; 3] =
            super::nvrtc::load(ctx, SOURCE, NAMES)?
                .try_into()
                .map_err(|_| KernelError::Cuda("mixed: wrong kernel count".into()))?;
        Ok(Self {
            to_bf16,
            from_bf16,
            round_bf16,
        })
    }

    /// A bf16 copy of `x` (same element count; at least one element, as every allocation).
    pub(super) fn to_bf16(&self, s: &Arc<CudaStream>, x: &CudaTensor) -> Result<CudaSlice<bf16>> {
        let n = len(x.numel())?;
        let mut out = s.alloc_zeros::<bf16>(x.numel().max(1)).map_err(cuda_err)?;
        let mut b = s.launch_builder(&self.to_bf16);
        b.arg(&mut out).arg(&x.data).arg(&n);
        // SAFETY: out and x hold at least n elements; the kernel guards i < n.
        unsafe { b.launch(grid(x.numel())) }.map_err(cuda_err)?;
        Ok(out)
    }

    /// Widens `x`'s bf16 values into `out` (exactly; `out.numel()` of them are read).
    pub(super) fn widen_bf16(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaSlice<bf16>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let live = out.numel();
        if x.len() < live {
            return Err(KernelError::Cuda(format!(
                "from_bf16: {} values for {live}",
                x.len()
            )));
        }
        let n = len(live)?;
        let mut b = s.launch_builder(&self.from_bf16);
        b.arg(&mut out.data).arg(x).arg(&n);
        // SAFETY: out and x hold at least n elements (checked above); the kernel guards i < n.
        unsafe { b.launch(grid(live)) }.map(drop).map_err(cuda_err)
    }

    /// Rounds `x` to bf16 values in place (its storage stays f32).
    pub(super) fn round_bf16(&self, s: &Arc<CudaStream>, x: &mut CudaTensor) -> Result<()> {
        let cfg = grid(x.numel());
        let n = len(x.numel())?;
        let mut b = s.launch_builder(&self.round_bf16);
        b.arg(&mut x.data).arg(&n);
        // SAFETY: x holds n floats; the kernel guards i < n.
        unsafe { b.launch(cfg) }.map(drop).map_err(cuda_err)
    }
}
