//! Fused causal multi-head attention on the GPU, FlashAttention-2 style
//! (`attention.cu`): the forward streams key/value tiles through shared
//! memory with an online softmax and keeps only the output and each row's
//! logsumexp; the backward recomputes the probabilities tile by tile from
//! Q, K and the logsumexp. Nothing of size seq x seq is ever allocated.
//!
//! The backward is deterministic: dQ in one kernel (blocks over query rows),
//! dK and dV in another (blocks over keys), each summing in a fixed order,
//! instead of FlashAttention-2's atomic dQ.
//!
//! Layouts are the CPU op's (`cpu::attention`): `qkv` is
//! `[batch * seq, w + 2 * kv_heads * head_dim]` with `w = heads * head_dim`,
//! each row `[Q_0 .. Q_{h-1} | K_0 .. | V_0 ..]`, query head `h` reading
//! key/value head `h / (heads / kv_heads)`; the output `[batch, seq, w]`; the
//! logsumexp `[batch, heads, seq]`. The dK/dV kernel runs per key/value head
//! and sums its query heads' contributions in head order. Supported: `head_dim <= 128` (the
//! kernels pad it to the next of 16, 32, 64, 128), `batch * heads <= 65535`;
//! anything else is refused with a shape error.

use super::rowops::int;
use super::{cuda_err, CudaTensor};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use pipewright_kernels_core::cpu::AttnShape;
use pipewright_kernels_core::error::{shape_err, KernelError, Result};
use std::sync::Arc;

const TEMPLATES: &str = include_str!("attention.cu");

/// Threads per block (`THREADS` of the source: 4 warps).
const THREADS: u32 = 128;
/// Warps per block (`WARPS`).
const WARPS: usize = 4;

/// One instantiation: padded head width `d` and the rows (queries, or keys
/// for dK/dV) each warp owns in each kernel. Shared memory per block stays
/// under 48 KB (static_assert in the source): at most about 43 KB, with
/// `d = 128`.
struct Tile {
    d: usize,
    fwd: usize,
    dq: usize,
    dkv: usize,
}

const TILES: [Tile; 4] = [
    Tile {
        d: 16,
        fwd: 8,
        dq: 8,
        dkv: 8,
    },
    Tile {
        d: 32,
        fwd: 8,
        dq: 8,
        dkv: 8,
    },
    Tile {
        d: 64,
        fwd: 8,
        dq: 8,
        dkv: 8,
    },
    Tile {
        d: 128,
        fwd: 4,
        dq: 2,
        dkv: 2,
    },
];

/// The templates and one `extern "C"` kernel per instantiation of [`TILES`].
pub(super) fn source() -> String {
    let mut src = TEMPLATES.to_string();
    let bwd = "(float* dqkv, const float* qkv, const float* dout, const float* lse, \
               const float* delta, int T, int H, int KV, int dh, float scale)";
    let bwd_args = "(dqkv, qkv, dout, lse, delta, T, H, KV, dh, scale)";
    for t in &TILES {
        let d = t.d;
        src += &format!(
            "\nextern \"C\" __global__ void __launch_bounds__(THREADS) attn_fwd_{d}\
             (float* out, float* lse, const float* qkv, int T, int H, int KV, int dh, \
             float scale) {{ attn_fwd<{d}, {}>(out, lse, qkv, T, H, KV, dh, scale); }}\n",
            t.fwd
        );
        src += &format!(
            "extern \"C\" __global__ void __launch_bounds__(THREADS) attn_bwd_dq_{d}{bwd} \
             {{ attn_bwd_dq<{d}, {}>{bwd_args}; }}\n",
            t.dq
        );
        src += &format!(
            "extern \"C\" __global__ void __launch_bounds__(THREADS) attn_bwd_dkv_{d}{bwd} \
             {{ attn_bwd_dkv<{d}, {}>{bwd_args}; }}\n",
            t.dkv
        );
    }
    src
}

/// Every kernel of [`source`]: per tile forward, dQ, dK/dV; then `attn_delta`.
pub(super) fn names() -> Vec<String> {
    let mut names: Vec<String> = TILES
        .iter()
        .flat_map(|t| {
            let d = t.d;
            [
                format!("attn_fwd_{d}"),
                format!("attn_bwd_dq_{d}"),
                format!("attn_bwd_dkv_{d}"),
            ]
        })
        .collect();
    names.push("attn_delta".into());
    names
}

/// The compiled attention kernels.
#[derive(Clone)]
pub(super) struct AttnKernels {
    /// Per tile of [`TILES`]: forward, dQ, dK/dV.
    per_tile: Vec<[CudaFunction; 3]>,
    delta: CudaFunction,
}

/// The tile serving `head_dim`, or the shape error naming the limit.
fn tile(op: &'static str, sh: AttnShape) -> Result<usize> {
    if sh.batch * sh.heads > 65535 {
        return Err(shape_err(
            op,
            format!("{sh:?}: batch * heads above the GPU kernels' 65535"),
        ));
    }
    TILES
        .iter()
        .position(|t| sh.head_dim <= t.d)
        .ok_or_else(|| shape_err(op, format!("{sh:?}: head_dim above the GPU kernels' 128")))
}

/// `ceil(n / rows_per_block) x batch * heads` blocks of [`THREADS`] (`heads`:
/// the query heads, or the key/value heads for dK/dV).
fn grid(sh: AttnShape, heads: usize, rows_per_warp: usize) -> Result<LaunchConfig> {
    let dim = |n: usize| {
        u32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} blocks exceed a grid")))
    };
    Ok(LaunchConfig {
        grid_dim: (
            dim(sh.seq.div_ceil(WARPS * rows_per_warp))?,
            dim(sh.batch * heads)?,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Sizes as the kernels' ints: `T`, `H`, `KV`, `dh`, and the softmax scale.
fn dims(sh: AttnShape) -> Result<([i32; 4], f32)> {
    let scale = 1.0 / (sh.head_dim as f32).sqrt();
    let ints = [sh.seq, sh.heads, sh.kv_heads, sh.head_dim].map(int);
    let [t, h, kv, dh] = ints;
    Ok(([t?, h?, kv?, dh?], scale))
}

/// Nothing to compute (and no block to launch) for an empty shape.
fn empty(sh: AttnShape) -> bool {
    sh.batch * sh.seq * sh.width() == 0
}

impl AttnKernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let names = names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut f = super::nvrtc::load(ctx, &source(), &refs)?.into_iter();
        let mut next = || f.next().expect("one function per name");
        let per_tile = TILES.iter().map(|_| [next(), next(), next()]).collect();
        Ok(Self {
            per_tile,
            delta: next(),
        })
    }

    /// Checks `sh` against what the kernels support (before any allocation).
    pub(super) fn check(&self, op: &'static str, sh: AttnShape) -> Result<()> {
        tile(op, sh).map(drop)
    }

    /// Fills `out` (`[batch, seq, w]`) and `lse` (`[batch, heads, seq]`)
    /// from `qkv`; shapes checked by the caller.
    pub(super) fn forward(
        &self,
        s: &Arc<CudaStream>,
        qkv: &CudaTensor,
        sh: AttnShape,
        out: &mut CudaTensor,
        lse: &mut CudaTensor,
    ) -> Result<()> {
        let i = tile("causal_attention", sh)?;
        if empty(sh) {
            return Ok(());
        }
        let ([t, h, kv, dh], scale) = dims(sh)?;
        let mut b = s.launch_builder(&self.per_tile[i][0]);
        b.arg(&mut out.data).arg(&mut lse.data).arg(&qkv.data);
        b.arg(&t).arg(&h).arg(&kv).arg(&dh).arg(&scale);
        // SAFETY: qkv is [batch * seq, w + 2 kv_heads head_dim], out
        // [batch * seq, w] and lse [batch * heads * seq], kv_heads dividing
        // heads (checked by the caller); blocks cover batch * heads heads and
        // seq rows, every index guarded by t < T.
        unsafe { b.launch(grid(sh, sh.heads, TILES[i].fwd)?) }
            .map(drop)
            .map_err(cuda_err)
    }

    /// Fills `dqkv` (shape of `qkv`, every element) from the forward's
    /// `qkv`, `out`, `lse` and the output gradient `dout`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &self,
        s: &Arc<CudaStream>,
        qkv: &CudaTensor,
        out: &CudaTensor,
        lse: &CudaTensor,
        dout: &CudaTensor,
        sh: AttnShape,
        dqkv: &mut CudaTensor,
    ) -> Result<()> {
        let i = tile("causal_attention_backward", sh)?;
        if empty(sh) {
            return Ok(());
        }
        let ([t, h, kv, dh], scale) = dims(sh)?;
        let mut delta = s.alloc_zeros::<f32>(lse.numel()).map_err(cuda_err)?;
        let rows = int(sh.batch * sh.seq)?;
        let warps = sh.batch * sh.seq * sh.heads;
        let blocks = u32::try_from(warps.div_ceil(WARPS))
            .map_err(|_| KernelError::Cuda(format!("{warps} warps exceed a grid")))?;
        let mut b = s.launch_builder(&self.delta);
        b.arg(&mut delta).arg(&out.data).arg(&dout.data);
        b.arg(&rows).arg(&t).arg(&h).arg(&dh);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: out and dout hold batch * seq * w floats, delta
        // batch * heads * seq; warps past batch * seq * heads return.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        let dq = (1, sh.heads, TILES[i].dq);
        let dkv = (2, sh.kv_heads, TILES[i].dkv);
        for (k, heads, rows_per_warp) in [dq, dkv] {
            let mut b = s.launch_builder(&self.per_tile[i][k]);
            b.arg(&mut dqkv.data).arg(&qkv.data).arg(&dout.data);
            b.arg(&lse.data).arg(&delta).arg(&t).arg(&h);
            b.arg(&kv).arg(&dh).arg(&scale);
            // SAFETY: as the forward; dQ (per query head) writes Q's columns,
            // dK/dV (per key/value head) K's and V's, each (row, column) once,
            // guarded by t < T and d < dh.
            unsafe { b.launch(grid(sh, heads, rows_per_warp)?) }.map_err(cuda_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_head_width_up_to_128_has_a_tile() {
        let sh = |head_dim| AttnShape::mha(2, 3, 4, head_dim);
        for (dh, d) in [
            (1, 16),
            (16, 16),
            (17, 32),
            (48, 64),
            (64, 64),
            (100, 128),
            (128, 128),
        ] {
            assert_eq!(TILES[tile("t", sh(dh)).unwrap()].d, d, "head_dim {dh}");
        }
        let err = tile("t", sh(129)).unwrap_err().to_string();
        assert!(err.contains("head_dim above the GPU kernels' 128"), "{err}");
        let wide = AttnShape {
            batch: 65536,
            ..sh(8)
        };
        assert!(tile("t", wide).is_err());
    }

    #[test]
    fn the_source_instantiates_every_named_kernel() {
        let src = source();
        for name in names() {
            assert!(src.contains(&format!("{name}(")), "{name}");
        }
    }
}
