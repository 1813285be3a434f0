//! Exactly what pipewright's reference GPT (`pipewright_kernels::gpt`) stashes per microbatch
//! on one TP rank, with `N = b * s` rows, width `d`, MLP width `f`, `a` (query) heads,
//! vocabulary `V`, TP size `t`; `q = d + 2 k` the fused QKV's width with `k` the key/value
//! heads' width (`k = d` without grouped-query attention), `u` the MLP's up projection's width
//! (`f`, or `2f` for a gated MLP's fused gate and up) and `g = u + f` the MLP's hidden tensors
//! (its pre-activation and activation: `2f`, or `3f` gated). Tensor elements (activations and their gradients) are kept in the run's
//! activation format: 4 bytes an element in f32 (and tf32) runs, 2 under
//! [`MemPrecision::Bf16`] (the kernels' `Backend::Kept`). Per-row statistics (`1/σ`), token
//! ids, the CPU's attention probabilities (the stand-in for what a GPU recomputes in f32)
//! and the loss's softmax probabilities stay 4 bytes in every precision. Below, `T[..]`
//! counts tensor elements and `R[..]` those 4-byte ones:
//!
//! - a block keeps both norms' `x̂` and `1/σ` (`T[2Nd] + R[2N]`; LayerNorm and RMSNorm keep
//!   the same), attention's input, `qkv` and context (`T[Nd + Nq/t + Nd/t]`) and
//!   probabilities (`R[b(a/t)s²]`, one per query head; a fused run's logsumexp `R[b(a/t)s]`
//!   instead) and the MLP's input, pre-activation and activation (`T[Nd + Ng/t]`); selective
//!   drops the probabilities;
//! - the first stage keeps its token ids (`R[N]`), the last the head's norm, normed input,
//!   softmax probabilities (the head is replicated, not split over t) and targets
//!   (`T[2Nd] + R[N(2 + V)]`);
//! - full recomputation keeps the ids on the first stage and a copy of the stage's input
//!   (`T[Nd]`) elsewhere; `every:n` keeps that and the stashes of the blocks past the first n;
//! - a split backward's weight stash holds, per block, both norms' stashes and input
//!   gradients and attention's and the MLP's inputs, output gradients, `dqkv`, context, the
//!   MLP's pre-activation gradient and activation (`T[8Nd + N(q + d + g)/t] + R[2N]`), the
//!   head's `T[N(3d + V)] + R[N]` and the embedding's gradient and ids `T[Nd] + R[N]`.
//!
//! - an MoE layer (by its index: dense layers first, then one in `every`) keeps its
//!   mixture's stash in place of the MLP's (`moe_stash`; under expert parallelism `N k` routed
//!   copies a rank, the average over its EP group), and its weight stash likewise; a rank
//!   holds `experts / ep` of each mixture's experts.
//!
//! Biases change no stash, and neither do rotary positions: attention keeps its queries and
//! keys turned in place of the projection's output (the `qkv` above is what the core read),
//! the rotation's backward needs no activation, and the embedding keeps its ids with or
//! without a position table. The shapes it counts are the reference GPT's: any key/value
//! heads, MLP, norm, biases and positions, with untied embeddings.
//!
//! With sequence parallelism a rank holds `M = N / t` rows of everything outside the TP
//! regions: the norms' stashes and the stashed inputs of attention and the MLP (`T[4Md] +
//! R[2M]` a block in place of `T[4Nd] + R[2N]`), the kept stage input under full
//! recomputation (`T[Md]`) and the hand-offs (`Md`). The weight stash keeps attention's and
//! the MLP's gathered inputs and output gradients whole (`T[4Nd]`) and the norms' on the
//! slice (`T[4Md] + R[2M]`); the head runs on the gathered stream and the embedding's
//! gradient is gathered, so both keep what they keep without SP. TP without SP is `M = N`
//! throughout.
//!
//! Pipeline hand-offs are f32 storage in every precision where the runtime counts them: from
//! the compute that makes one to its send, and from its receive to the compute that uses it,
//! the executor holds an f32 tensor (a bf16 run's values are bf16-rounded but stored in f32).
//! What a transport carries in between (bf16 bytes over MPI, bf16 payloads over CUDA-local
//! and NCCL in a bf16 run) is the transport's, so [`handoff_bytes`] counts 4 bytes an element.

use super::walk::StageBytes;
use super::{params, MemPrecision, MemoryConfig, MemoryError, ModelShape};
use crate::shape::AttentionKind;
use pipewright_schedule::recompute::Recompute;

const F32: u128 = 4;

/// Elements of a stash: tensor elements (in the activation format) and 4-byte ones (per-row
/// statistics, ids, the attention's and the loss's probabilities).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Elems {
    tensor: u128,
    row: u128,
}

impl Elems {
    fn tensor(tensor: u128) -> Self {
        Elems { tensor, row: 0 }
    }
    fn row(row: u128) -> Self {
        Elems { tensor: 0, row }
    }
    fn bytes(self, cfg: &MemoryConfig) -> u128 {
        tensor_size(cfg) * self.tensor + F32 * self.row
    }
}

impl std::ops::Add for Elems {
    type Output = Elems;
    fn add(self, o: Elems) -> Elems {
        Elems {
            tensor: self.tensor + o.tensor,
            row: self.row + o.row,
        }
    }
}

impl std::ops::Mul<Elems> for u128 {
    type Output = Elems;
    fn mul(self, e: Elems) -> Elems {
        Elems {
            tensor: self * e.tensor,
            row: self * e.row,
        }
    }
}

/// Bytes of a kept tensor element: 2 in a bf16 run, else 4.
fn tensor_size(cfg: &MemoryConfig) -> u128 {
    match cfg.precision {
        MemPrecision::Bf16 => 2,
        MemPrecision::F32 => F32,
    }
}

/// `(N, d, f, t, the attention core's 4-byte elements)`: the probabilities `b(a/t)s²` where
/// attention is materialized (the CPU backend), one logsumexp per row and head `b(a/t)s`
/// where it is fused (the CUDA backend's FlashAttention-2-style kernel).
fn dims(cfg: &MemoryConfig) -> (u128, u128, u128, u128, u128) {
    let sh = &cfg.shape;
    let (b, s) = (u128::from(cfg.microbatch_size), u128::from(sh.seq_len));
    let t = u128::from(cfg.tp.max(1));
    let per_row = match cfg.attention {
        AttentionKind::Materialized => s,
        AttentionKind::Fused => 1,
    };
    let core = b * (u128::from(sh.heads) / t) * s * per_row;
    (b * s, u128::from(sh.d_model), u128::from(sh.ffn), t, core)
}

/// Refuses a shape the reference GPT does not have (it is the one model this accounting
/// counts), naming what differs: it has any key/value heads, MLP, norm, biases and
/// positions, but untied embeddings only.
pub(super) fn check_shape(shape: &ModelShape) -> Result<(), MemoryError> {
    if shape.tied_embeddings {
        return Err(MemoryError::NotReference("tied embeddings".into()));
    }
    Ok(())
}

/// Refuses what the reference GPT's mixture does not run: a capacity factor (it routes
/// dropless, and its stash does not depend on the routing but for the EP split), ZeRO-1 with
/// expert parallelism and sequence parallelism (the runtime refuses both beside a mixture).
/// Its experts are split over the TP group, so `etp` is read as `tp`.
pub(super) fn check_mixture(cfg: &MemoryConfig) -> Result<(), MemoryError> {
    if cfg.shape.moe.is_none() {
        return Ok(());
    }
    let what = if cfg.experts.capacity != 1.0 {
        "capacity factor (it routes dropless)"
    } else if cfg.zero >= 1 && cfg.experts.ep > 1 {
        "ZeRO-1 with expert parallelism"
    } else if cfg.sequence_parallel && cfg.tp > 1 {
        "mixture of experts under sequence parallelism"
    } else {
        return Ok(());
    };
    Err(MemoryError::NotReference(what.into()))
}

/// `(q, g)`: the fused QKV's width and the MLP's hidden tensors' (pre-activation and
/// activation), whole (before the TP split).
fn widths(cfg: &MemoryConfig) -> (u128, u128) {
    let sh = &cfg.shape;
    let q = u128::from(sh.d_model + 2 * sh.kv_width());
    let g = u128::from(sh.ffn * (sh.mlp.up_matrices() + 1));
    (q, g)
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

/// One block's whole stash, the attention probabilities included: block `i` (0-based) of
/// the model, a mixture's MLP part in place of the dense one where it is an MoE layer.
fn block(cfg: &MemoryConfig, i: u32) -> Elems {
    let (n, d, _, t, core) = dims(cfg);
    let (q, g) = widths(cfg);
    let m = slice_rows(cfg);
    let attention = Elems {
        tensor: 3 * m * d + n * (q + d) / t,
        row: 2 * m + core,
    };
    match moe_stash(cfg, i) {
        Some(mixture) => attention + mixture,
        None => attention + Elems::tensor(m * d + n * g / t),
    }
}

/// The MLP part of MoE layer `i`'s stash (`None` for a dense layer), as
/// `pipewright_kernels::layers::MoeStash` counts it: its input `T[Nd]`; the routing's
/// probabilities, gates and chosen experts (`R[NE + Nk + 2Nk]`, the indices 8 bytes); the
/// routed copies' outputs as they came back (`R[Nkd]`, host f32 in every precision); where
/// the rows went (`R[4Nk]`: a pair of 8-byte indices a copy) and the rows each source and
/// destination count for each expert (`R[4E]`: `2 E` 8-byte counts); the `Nk` copies' MLP
/// stashes (input, pre-activation and activation `T[Nk(d + g_e/t)]`), and the shared
/// expert's `T[N(d + g_s/t)]`. Under expert parallelism a rank keeps the stashes of the
/// copies its experts received: `Nk` on average, more or fewer as tokens are routed.
fn moe_stash(cfg: &MemoryConfig, i: u32) -> Option<Elems> {
    let mx = cfg.shape.moe.filter(|m| m.is_moe_layer(i))?;
    let (n, d, _, t, _) = dims(cfg);
    let (e, k) = (u128::from(mx.experts), u128::from(mx.top_k));
    let hidden = u128::from(cfg.shape.mlp.up_matrices() + 1);
    let shared_ffn = u128::from(mx.shared_experts) * u128::from(mx.shared_ffn);
    let shared = if shared_ffn > 0 {
        Elems::tensor(n * (d + hidden * shared_ffn / t))
    } else {
        Elems::default()
    };
    let routed = Elems::tensor(n * k * (d + hidden * u128::from(mx.expert_ffn) / t));
    let routing = Elems::row(n * e + 3 * n * k);
    let layout = Elems::row(4 * n * k + 4 * e);
    Some(Elems::tensor(n * d) + routing + Elems::row(n * k * d) + layout + routed + shared)
}

/// The MLP part of MoE layer `i`'s weight stash (`None` for a dense layer), as
/// `MoeWeightStash` counts it: its input and the router's logits' gradient `T[N(d + E)]`,
/// and each copy's and the shared expert's MLP weight stash (input, output gradient,
/// pre-activation gradient and activation: `T[Nk(2d + g_e/t) + N(2d + g_s/t)]`).
fn moe_weight_stash(cfg: &MemoryConfig, i: u32) -> Option<Elems> {
    let mx = cfg.shape.moe.filter(|m| m.is_moe_layer(i))?;
    let (n, d, _, t, _) = dims(cfg);
    let (e, k) = (u128::from(mx.experts), u128::from(mx.top_k));
    let hidden = u128::from(cfg.shape.mlp.up_matrices() + 1);
    let shared_ffn = u128::from(mx.shared_experts) * u128::from(mx.shared_ffn);
    let shared = if shared_ffn > 0 {
        n * (2 * d + hidden * shared_ffn / t)
    } else {
        0
    };
    let routed = n * k * (2 * d + hidden * u128::from(mx.expert_ffn) / t);
    Some(Elems::tensor(n * (d + e) + routed + shared))
}

/// One block's stash under selective recomputation: all but the probabilities.
fn block_selective(cfg: &MemoryConfig, i: u32) -> Elems {
    let (.., core) = dims(cfg);
    let whole = block(cfg, i);
    Elems {
        row: whole.row - core,
        ..whole
    }
}

/// The sum of `f` over the blocks (0-based) of stage `s`.
fn sum_blocks(cfg: &MemoryConfig, s: u32, f: impl Fn(u32) -> Elems) -> Elems {
    sum_range(
        cfg,
        params::stage_range(cfg.shape.layers, cfg.stages(), s),
        f,
    )
}

/// The sum of `f` over the blocks `range`, in time independent of its length: a block's
/// stash depends only on whether it is an MoE layer, so each kind is counted once and
/// multiplied (a request for 10^8 layers is refused in milliseconds, not walked).
fn sum_range(cfg: &MemoryConfig, range: std::ops::Range<u32>, f: impl Fn(u32) -> Elems) -> Elems {
    let len = u128::from(range.end.saturating_sub(range.start));
    if len == 0 {
        return Elems::default();
    }
    let Some(m) = cfg.shape.moe else {
        return len * f(range.start);
    };
    let moe = u128::from(m.moe_layers(range.end) - m.moe_layers(range.start));
    // The first of each kind is within one step of `every` (or the dense prefix) of the start.
    let first = |want: bool| range.clone().find(|&i| m.is_moe_layer(i) == want);
    let of = |n: u128, want: bool| match n {
        0 => Elems::default(),
        n => first(want).map_or_else(Elems::default, |i| n * f(i)),
    };
    of(moe, true) + of(len - moe, false)
}

/// Bytes of one pipeline hand-off (a stage's output or input gradient) on one rank: f32
/// storage in every precision (see the module's doc).
pub(super) fn handoff_bytes(cfg: &MemoryConfig) -> u64 {
    let d = u128::from(cfg.shape.d_model);
    u64::try_from(F32 * slice_rows(cfg) * d).unwrap_or(u64::MAX)
}

/// One block's bytes under `policy` (the first MoE layer's where the shape has a mixture, as
/// the largest); a block a policy recomputes keeps nothing of its own.
pub(super) fn layer_bytes(cfg: &MemoryConfig, policy: Recompute) -> u64 {
    let i = cfg.shape.moe.map_or(0, |m| {
        m.dense_layers.min(cfg.shape.layers.saturating_sub(1))
    });
    let elements = match policy {
        Recompute::None => block(cfg, i),
        Recompute::Selective => block_selective(cfg, i),
        Recompute::Full | Recompute::Every(_) => Elems::default(),
    };
    u64::try_from(elements.bytes(cfg)).unwrap_or(u64::MAX)
}

/// Stage `s`'s bytes per microbatch.
pub(super) fn stage_bytes(cfg: &MemoryConfig, s: u32) -> StageBytes {
    let (n, d, _, t, _) = dims(cfg);
    let (q, g) = widths(cfg);
    let v = u128::from(cfg.shape.vocab);
    let m = slice_rows(cfg);
    let range = params::stage_range(cfg.shape.layers, cfg.stages(), s);
    let (first, last) = (s == 0, s + 1 == cfg.stages());
    let none = Elems::default();
    let ids = if first { Elems::row(n) } else { none };
    let head = if last {
        Elems::tensor(2 * n * d) + Elems::row(n * (2 + v))
    } else {
        none
    };
    let input = if first { none } else { Elems::tensor(m * d) };
    let full = ids + sum_blocks(cfg, s, |i| block(cfg, i)) + head;
    let kept = match cfg.recompute.of(s) {
        Recompute::None => full,
        Recompute::Selective => ids + sum_blocks(cfg, s, |i| block_selective(cfg, i)) + head,
        Recompute::Full => ids + input,
        Recompute::Every(k) => {
            // The first k blocks of the stage are recomputed; the rest keep their stashes.
            let from = range.start + k.min(range.len() as u32);
            let rest = sum_range(cfg, from..range.end, |i| block(cfg, i));
            ids + input + rest + head
        }
    };
    // Attention's and the norms' part of a block's weight stash, then its MLP's.
    let attention_w = Elems {
        tensor: 4 * m * d + 2 * n * d + n * (q + d) / t,
        row: 2 * m,
    };
    let block_w =
        |i| attention_w + moe_weight_stash(cfg, i).unwrap_or(Elems::tensor(2 * n * d + n * g / t));
    let embed_w = if first {
        Elems::tensor(n * d) + Elems::row(n)
    } else {
        none
    };
    let head_w = if last {
        Elems::tensor(n * (3 * d + v)) + Elems::row(n)
    } else {
        none
    };
    let weight = embed_w + sum_blocks(cfg, s, block_w) + head_w;
    let bytes = |e: Elems| e.bytes(cfg) as f64;
    StageBytes {
        kept: bytes(kept),
        full: bytes(full),
        weight: bytes(weight),
        whole: bytes(full),
    }
}
