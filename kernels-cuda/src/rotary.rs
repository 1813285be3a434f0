//! Rotary position embeddings on the GPU, compiled with NVRTC: the CPU op's rotation
//! ([`pipewright_kernels_core::cpu::rotary`]) of the query and key heads of a fused `qkv`, in place, one
//! thread per turned pair, from the same host-computed table of cosines and sines.
//!
//! Each output is two products and a sum, each rounded (`__fmul_rn`, `__fadd_rn`,
//! `__fsub_rn`: NVRTC would otherwise contract them into a fused multiply-add), so the GPU
//! turns every pair to the CPU's bits.

use super::rowops::int;
use super::{cuda_err, CudaTensor};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use pipewright_kernels_core::cpu::rotary::Turn;
use pipewright_kernels_core::cpu::AttnShape;
use std::sync::Arc;

use pipewright_kernels_core::error::{KernelError, Result};

/// One thread per (row, turned head, pair): `n = rows * heads * half`, `heads` the query
/// heads then the key heads at the start of each row of `w3` columns, `half = head_dim / 2`;
/// the table row of position `row % seq` is `[cos_0 .. cos_{half-1} | sin_0 ..]`.
/// `dir` is +1 forward, -1 for the inverse rotation (the backward).
pub(super) const SOURCE: &str = r#"
extern "C" __global__ void rope(float* x, const float* table, long long n, int heads,
                                int half, int w3, int seq, int dir) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int j = (int)(i % half);
    long long rh = i / half;
    int h = (int)(rh % heads);
    long long row = rh / heads;
    const float* t = table + (row % seq) * (2LL * half);
    float c = t[j], s = t[half + j];
    float* p = x + row * w3 + (long long)h * 2 * half;
    float a = p[j], b = p[half + j];
    if (dir > 0) {
        p[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        p[half + j] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    } else {
        p[j] = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        p[half + j] = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}
"#;

/// The kernels of [`SOURCE`].
pub(super) const NAMES: &[&str] = &["rope"];

/// 256-thread blocks.
const THREADS: u32 = 256;

#[derive(Clone)]
pub(super) struct RotaryKernels {
    rope: CudaFunction,
}

impl RotaryKernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut f = super::nvrtc::load(ctx, SOURCE, NAMES)?.into_iter();
        let rope = f.next().expect("one function per name");
        Ok(Self { rope })
    }

    /// Turns `qkv`'s query and key heads in place; shapes checked by the caller
    /// (`cpu::rotary::check`).
    pub(super) fn rotate(
        &self,
        s: &Arc<CudaStream>,
        qkv: &mut CudaTensor,
        table: &CudaTensor,
        sh: AttnShape,
        dir: Turn,
    ) -> Result<()> {
        let (heads, half) = (sh.heads + sh.kv_heads, sh.head_dim / 2);
        let n = sh.batch * sh.seq * heads * half;
        if n == 0 {
            return Ok(());
        }
        let blocks = u32::try_from(n.div_ceil(THREADS as usize))
            .map_err(|_| KernelError::Cuda(format!("{n} pairs exceed a grid")))?;
        let n = i64::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} pairs")))?;
        let (h, hf, w3, seq) = (int(heads)?, int(half)?, int(sh.qkv_width())?, int(sh.seq)?);
        let dir: i32 = match dir {
            Turn::Forward => 1,
            Turn::Inverse => -1,
        };
        let mut b = s.launch_builder(&self.rope);
        b.arg(&mut qkv.data).arg(&table.data).arg(&n);
        b.arg(&h).arg(&hf).arg(&w3).arg(&seq).arg(&dir);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: qkv is [batch * seq, w3] with the query and key heads in its first
        // heads * 2 * half columns and table [>= seq, 2 * half] (checked by the caller);
        // thread i < n touches one pair of one row, each pair once.
        unsafe { b.launch(cfg) }.map(drop).map_err(cuda_err)
    }
}
