//! Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
//! (MLSys 2023), section 4: activation bytes of one transformer layer for one microbatch on
//! one tensor-parallel rank, with 2-byte activations and 1-byte dropout masks, generalised
//! to the kinds of [`crate::shape`] tensor by tensor. Per token, for `b s` tokens:
//!
//! - outside the TP regions (split by `t` only under sequence parallelism): both norms'
//!   inputs and the QKV and MLP inputs (the norms' outputs), `2h` bytes each, and the two
//!   dropout masks after the row-parallel layers, `h` each: `10h`;
//! - inside them (split by `t`): the queries `2h`, keys and values `2 kv` each (`kv` the
//!   key/value width, `h` without grouped-query attention), the attention output (the
//!   projection's input) `2h`, and the MLP's `ffn`-wide tensors, `2 ffn` each: GeLU's input
//!   and output, or a gated MLP's gate, up and product ([`crate::shape::MlpKind::hidden_tensors`]). With
//!   multi-head attention and a GeLU MLP of `4h` this is the paper's `24h`;
//! - the attention core, by the run's [`AttentionKind`]: materialized, the softmax output
//!   and its dropout output (`2as` each) and the dropout mask (`as`), the paper's `5as`;
//!   fused (FlashAttention; Dao et al. 2022, section 3.1, and Dao 2023, algorithm 1), no
//!   `s x s` tensor at all: the forward keeps its output (already counted as the
//!   projection's input) and one f32 logsumexp per row and query head, `4a` bytes a token
//!   (the backward recomputes the probabilities from it; dropout is replayed from the RNG
//!   state, so no mask is kept).
//!
//! Without parallelism the materialized sum is the paper's `sbh(34 + 5as/h)`; with TP
//! `sbh(10 + 24/t + 5as/(ht))`, with TP and SP `(sbh/t)(34 + 5as/h)`.
//!
//! Selective recomputation drops what is large to keep and cheap to rebuild (the paper's
//! criterion), which depends on the attention kind:
//! - materialized: the attention core, `5as` a token, rebuilt by rerunning its two batched
//!   matmuls and softmax from the kept Q, K and V (the paper's selective recomputation);
//! - fused: the core keeps nothing worth dropping (rerunning it to save `4a` bytes a token
//!   would cost its matmuls again; NVIDIA's Megatron Bridge guide on activation
//!   recomputation says the same: with fused or flash attention, compare `core_attn`
//!   recomputation against none, "because those backends already rematerialize attention
//!   internals"). What is large and cheap there is element-wise: the norms' outputs (the QKV
//!   and MLP inputs, `2h` each, rebuilt from the kept norm inputs) and the MLP activation's
//!   output (`2 ffn`, GeLU's output or a gated MLP's product, rebuilt from its kept inputs),
//!   the tensors Megatron-Core's selective recompute modules `layernorm` and `moe_act` (the
//!   latter for an MoE's experts) rebuild. The rebuild reads and writes those tensors once
//!   more and does no matmul.
//!
//! Full recomputation keeps the layer input `2sbh` (`/t` with SP). Section 4.3 adds the
//! input and output layers: the embedding's dropout mask (`sbh`, `/t` with sequence
//! parallelism) on the first stage; the final norm's and the output projection's inputs
//! (`4sbh`, `/t` with sequence parallelism) and the logits in f32 for the cross entropy
//! (`4sbV/t`, the output layer being vocabulary-parallel) on the last. Megatron recomputes
//! transformer layers only, so these extras are kept under every policy.

use super::moe::moe_activations;
use super::walk::StageBytes;
use super::{params, MemoryConfig};
use crate::shape::AttentionKind;
use pipewright_schedule::recompute::Recompute;

/// A layer's bytes per microbatch on one rank, by what selective recomputation does with
/// them (integers, `b s` tokens folded in).
struct Layer {
    /// Kept under every policy but full.
    kept: u128,
    /// Dropped by selective recomputation.
    selective: u128,
}

/// `(s*b, t)` of a configuration.
fn dims(cfg: &MemoryConfig) -> (u128, u128) {
    let tokens = u128::from(cfg.shape.seq_len) * u128::from(cfg.microbatch_size);
    (tokens, u128::from(cfg.tp.max(1)))
}

/// Attention's projections' bytes per token inside the TP regions, `(split by t, whole)`:
/// the queries, keys and values and the attention output (the projection's input), `2`
/// bytes an element; with QK norms the normalized queries and keys as well. Latent attention
/// keeps, whole on every TP rank as its down projections run, the two bottlenecks and their
/// norms' outputs (`2 (2 r_q + 2 r_kv + rope)`), and split over TP its up projections'
/// queries, keys and values and the attention output (`2 (2 a qk + 2 a v)`).
fn attention_widths(cfg: &MemoryConfig) -> (u128, u128) {
    let sh = &cfg.shape;
    if let Some(m) = sh.mla {
        let a = u128::from(sh.heads);
        let (qk, v) = (u128::from(m.qk_head_dim()), u128::from(m.v_head_dim));
        let (rq, rkv) = (
            u128::from(m.q_lora_rank.unwrap_or(0)),
            u128::from(m.kv_lora_rank),
        );
        let whole = 2 * (2 * rq + 2 * rkv + u128::from(m.qk_rope_head_dim));
        return (2 * (2 * a * qk + 2 * a * v), whole);
    }
    let (q, kv) = (u128::from(sh.q_width()), u128::from(sh.kv_width()));
    let normed = if sh.qk_norm { 2 * (q + kv) } else { 0 };
    (2 * (2 * q + 2 * kv) + normed, 0)
}

/// Layer `i`'s bytes (see the module's note): an MoE layer's MLP part is
/// [`moe_activations`]'s stash, all of it kept under every policy but full except the
/// activation's outputs, which fused selective recomputation rebuilds (Megatron's `moe_act`)
/// as it does a dense MLP's, and as the plan's time model charges it.
fn layer(cfg: &MemoryConfig, i: u32) -> Layer {
    let sh = &cfg.shape;
    let (tokens, t) = dims(cfg);
    let h = u128::from(sh.d_model);
    let f = u128::from(sh.ffn);
    let a = u128::from(sh.heads);
    let s = u128::from(sh.seq_len);
    let outside = if cfg.sequence_parallel { t } else { 1 };
    let hidden = u128::from(sh.mlp.hidden_tensors());
    // Norm inputs (4h) and masks (2h) are kept; the norms' outputs (4h) are what fused
    // selective recomputation rebuilds.
    let norm_outputs = tokens * 4 * h / outside;
    let other_outside = tokens * 6 * h / outside;
    let (split, whole) = attention_widths(cfg);
    let attention = tokens * split / t + tokens * whole;
    let e = &cfg.experts;
    let experts = sh
        .is_moe_layer(i)
        .then(|| moe_activations(sh, tokens as u64, cfg.tp, e.etp, e.capacity))
        .flatten();
    let (mlp_kept, mlp_output) = match experts {
        Some(m) => (
            u128::from(m.stash - m.activation_output),
            u128::from(m.activation_output),
        ),
        None => (tokens * 2 * (hidden - 1) * f / t, tokens * 2 * f / t),
    };
    match cfg.attention {
        AttentionKind::Materialized => Layer {
            kept: other_outside + norm_outputs + attention + mlp_kept + mlp_output,
            selective: tokens * 5 * a * s / t,
        },
        AttentionKind::Fused => Layer {
            kept: other_outside + attention + mlp_kept + tokens * 4 * a / t,
            selective: norm_outputs + mlp_output,
        },
    }
}

/// Bytes of the dispatch buffers of stage `s`'s MoE layers on one rank, alive while one of
/// them dispatches (0 for a stage without one).
pub(super) fn dispatch_bytes(cfg: &MemoryConfig, s: u32) -> u64 {
    let range = params::stage_range(cfg.shape.layers, cfg.stages(), s);
    if !range.clone().any(|i| cfg.shape.is_moe_layer(i)) {
        return 0;
    }
    let (tokens, _) = dims(cfg);
    let e = &cfg.experts;
    moe_activations(&cfg.shape, tokens as u64, cfg.tp, e.etp, e.capacity)
        .map_or(0, |m| m.dispatch_buffers)
}

/// Bytes of one pipeline hand-off on one rank: `2sbh`, `/t` with sequence parallelism.
pub(super) fn handoff_bytes(cfg: &MemoryConfig) -> u64 {
    let (tokens, t) = dims(cfg);
    let split = if cfg.sequence_parallel { t } else { 1 };
    u64::try_from(2 * tokens * u128::from(cfg.shape.d_model) / split).unwrap_or(u64::MAX)
}

/// The first layer's bytes under `policy` (for `Every`, a layer that is recomputed: its
/// input); every layer's, of a uniform shape.
pub(super) fn layer_bytes(cfg: &MemoryConfig, policy: Recompute) -> u64 {
    layer_i_bytes(cfg, 0, policy)
}

/// Layer `i`'s bytes under `policy`.
fn layer_i_bytes(cfg: &MemoryConfig, i: u32, policy: Recompute) -> u64 {
    let l = layer(cfg, i);
    let bytes = match policy {
        Recompute::None => l.kept + l.selective,
        Recompute::Selective => l.kept,
        Recompute::Full | Recompute::Every(_) => handoff_bytes(cfg).into(),
    };
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// The input and output layers' bytes of stage `s` (see the module's note).
fn extras(cfg: &MemoryConfig, s: u32) -> u128 {
    let (tokens, t) = dims(cfg);
    let sbh = tokens * u128::from(cfg.shape.d_model);
    let split = if cfg.sequence_parallel { t } else { 1 };
    let sbv = u128::from(cfg.shape.seq_len)
        * u128::from(cfg.microbatch_size)
        * u128::from(cfg.shape.vocab);
    let first = if s == 0 { sbh / split } else { 0 };
    let last = if s + 1 == cfg.stages() {
        4 * sbh / split + 4 * sbv / t
    } else {
        0
    };
    first + last
}

/// Stage `s`'s bytes per microbatch. Megatron recomputes inside each layer's backward, one
/// layer at a time, so a recomputing stage grows by one layer's dropped bytes before its
/// backward (an `R` is counted the same way). W holds the zero-bubble paper's
/// `M_W = 32sbh` per layer (Qi et al. 2023, section 2.3), split over t, and the extras.
pub(super) fn stage_bytes(cfg: &MemoryConfig, s: u32) -> StageBytes {
    let range = params::stage_range(cfg.shape.layers, cfg.stages(), s);
    let layers = u128::from(range.end - range.start);
    let (tokens, t) = dims(cfg);
    let sbh = tokens * u128::from(cfg.shape.d_model);
    // A layer's bytes depend only on whether it is an MoE layer: a uniform shape's first
    // layer stands for all, a mixture's first MoE layer for every MoE layer.
    let first_moe = (0..cfg.shape.layers).find(|&i| cfg.shape.is_moe_layer(i));
    let first_dense = (0..cfg.shape.layers).find(|&i| !cfg.shape.is_moe_layer(i));
    let kinds = [Recompute::None, cfg.recompute.of(s)];
    let table = |first: Option<u32>| first.map(|i| kinds.map(|p| layer_i_bytes(cfg, i, p)));
    let (moe, dense) = (table(first_moe), table(first_dense));
    let layer = |i: u32, p: Recompute| {
        let row = if cfg.shape.is_moe_layer(i) {
            moe
        } else {
            dense
        };
        match (row, kinds.iter().position(|&k| k == p)) {
            (Some(r), Some(at)) => u128::from(r[at]),
            _ => u128::from(layer_i_bytes(cfg, i, p)),
        }
    };
    let extra = extras(cfg, s);
    let input = u128::from(handoff_bytes(cfg));
    let whole: u128 = range.clone().map(|i| layer(i, Recompute::None)).sum();
    let (kept, one_layer) = match cfg.recompute.of(s) {
        Recompute::Every(n) => {
            let k = layers.min(u128::from(n)) as u32;
            let rerun = range.start..range.start + k;
            let kept = u128::from(k) * input
                + (rerun.end..range.end)
                    .map(|i| layer(i, Recompute::None))
                    .sum::<u128>()
                + extra;
            let grows = rerun.map(|i| layer(i, Recompute::None) - input).max();
            (kept, grows.unwrap_or(0))
        }
        policy => {
            let kept: u128 = range.clone().map(|i| layer(i, policy)).sum();
            let grows = range
                .clone()
                .map(|i| layer(i, Recompute::None) - layer(i, policy));
            (kept + extra, grows.max().unwrap_or(0))
        }
    };
    let weight = layers * 32 * sbh / t + extra;
    StageBytes {
        kept: kept as f64,
        full: (kept + one_layer) as f64,
        weight: weight as f64,
        whole: (whole + extra) as f64,
    }
}
