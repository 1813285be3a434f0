//! Exactly what pipewright's reference GPT (`pipewright_kernels::gpt`) stashes per microbatch
//! on one TP rank, in its f32 storage (4 bytes an element, token ids 4 bytes each), with
//! `N = b * s` rows, width `d`, MLP width `f`, `a` heads, vocabulary `V`, TP size `t`:
//!
//! - a block keeps both LayerNorms' `x̂` and `1/σ` (`2N(d+1)`), attention's input, `qkv`,
//!   probabilities and context (`Nd + 3Nd/t + b(a/t)s² + Nd/t`) and the MLP's input,
//!   pre-activation and activation (`Nd + 2Nf/t`); selective drops the probabilities;
//! - the first stage keeps its token ids (`N`), the last the head's norm, normed input,
//!   softmax probabilities (the head is replicated, not split over t) and targets
//!   (`N(2d + 2 + V)`);
//! - full recomputation keeps the ids on the first stage and a copy of the stage's input
//!   (`Nd`) elsewhere; `every:n` keeps that and the stashes of the blocks past the first n;
//! - a split backward's weight stash holds, per block, both norms' stashes and input
//!   gradients and attention's and the MLP's inputs, output gradients, `dqkv`, context and
//!   activations (`N(8d + 2) + 4Nd/t + 2Nf/t`), the head's `N(3d + 1 + V)` and the
//!   embedding's ids and gradient `N(d + 1)`.
//!
//! With sequence parallelism a rank holds `M = N / t` rows of everything outside the TP
//! regions: the norms' stashes and the stashed inputs of attention and the MLP (`M(4d + 2)`
//! a block in place of `N(4d + 2)`), the kept stage input under full recomputation (`Md`) and
//! the hand-offs (`Md`). The weight stash keeps attention's and the MLP's gathered inputs and
//! output gradients whole (`4Nd`) and the norms' on the slice (`M(4d + 2)`); the head runs on
//! the gathered stream and the embedding's gradient is gathered, so both keep what they keep
//! without SP. TP without SP is `M = N` throughout.

use super::walk::StageBytes;
use super::{params, MemoryConfig};
use crate::recompute::Recompute;

const F32: u128 = 4;

/// `(N, d, f, t, the attention probabilities' elements b(a/t)s²)`.
fn dims(cfg: &MemoryConfig) -> (u128, u128, u128, u128, u128) {
    let sh = &cfg.shape;
    let (b, s) = (u128::from(cfg.microbatch_size), u128::from(sh.seq_len));
    let t = u128::from(cfg.tp.max(1));
    let core = b * (u128::from(sh.heads) / t) * s * s;
    (b * s, u128::from(sh.d_model), u128::from(sh.ffn), t, core)
}

/// Rows a rank holds outside the TP regions: `N / t` under sequence parallelism, else `N`.
fn slice_rows(cfg: &MemoryConfig) -> u128 {
    let (n, _, _, t, _) = dims(cfg);
    if cfg.sequence_parallel {
        n / t
    } else {
        n
    }
}

/// Elements of one block's whole stash.
fn block(cfg: &MemoryConfig) -> u128 {
    let (n, d, f, t, core) = dims(cfg);
    slice_rows(cfg) * (4 * d + 2) + 4 * n * d / t + 2 * n * f / t + core
}

/// Bytes of one pipeline hand-off (a stage's output or input gradient) on one rank.
pub(super) fn handoff_bytes(cfg: &MemoryConfig) -> u64 {
    let d = u128::from(cfg.shape.d_model);
    u64::try_from(F32 * slice_rows(cfg) * d).unwrap_or(u64::MAX)
}

/// One block's bytes under `policy`; a block a policy recomputes keeps nothing of its own.
pub(super) fn layer_bytes(cfg: &MemoryConfig, policy: Recompute) -> u64 {
    let (.., core) = dims(cfg);
    let elements = match policy {
        Recompute::None => block(cfg),
        Recompute::Selective => block(cfg) - core,
        Recompute::Full | Recompute::Every(_) => 0,
    };
    u64::try_from(F32 * elements).unwrap_or(u64::MAX)
}

/// Stage `s`'s bytes per microbatch.
pub(super) fn stage_bytes(cfg: &MemoryConfig, s: u32) -> StageBytes {
    let (n, d, f, t, _) = dims(cfg);
    let v = u128::from(cfg.shape.vocab);
    let layers = u128::from(params::stage_layers(cfg.shape.layers, cfg.stages(), s));
    let (first, last) = (s == 0, s + 1 == cfg.stages());
    let ids = if first { n } else { 0 };
    let head = if last { n * (2 * d + 2 + v) } else { 0 };
    let input = if first { 0 } else { slice_rows(cfg) * d };
    let layer = |p| u128::from(layer_bytes(cfg, p)) / F32;
    let full = ids + layers * block(cfg) + head;
    let kept = match cfg.recompute.of(s) {
        Recompute::None => full,
        Recompute::Selective => ids + layers * layer(Recompute::Selective) + head,
        Recompute::Full => ids + input,
        Recompute::Every(k) => {
            let kept_blocks = layers - layers.min(u128::from(k));
            ids + input + kept_blocks * block(cfg) + head
        }
    };
    let block_w = slice_rows(cfg) * (4 * d + 2) + 4 * n * d + 4 * n * d / t + 2 * n * f / t;
    let weight = if first { n * (d + 1) } else { 0 }
        + layers * block_w
        + if last { n * (3 * d + 1 + v) } else { 0 };
    StageBytes {
        kept: (F32 * kept) as f64,
        full: (F32 * full) as f64,
        weight: (F32 * weight) as f64,
        whole: (F32 * full) as f64,
    }
}
