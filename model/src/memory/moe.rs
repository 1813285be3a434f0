//! The memory of a mixture of experts under expert parallelism, in closed form: the pieces
//! [`super::predict`] adds for an MoE shape under the Megatron accounting, with the
//! configuration's [`ExpertLayout`]. Megatron-Core's layout, with its
//! parallel folding (a stage's `tp x dp` GPUs run attention as TP x DP and the experts as
//! expert-TP `etp` x EP `ep` x expert-DP `edp = tp dp / (etp ep)`):
//!
//! - The dense side of a layer (attention, its norms, the router, the shared experts, and
//!   the whole MLP of a dense layer) is split over TP as a dense block is: column- and
//!   row-parallel matrices by `tp`, norms and the router whole. Of latent attention the two
//!   down projections (queries' and keys' and values') and the bottlenecks' norms are whole
//!   on every TP rank (Megatron-Core builds them "duplicated"), the up and output
//!   projections split.
//! - The expert side: each EP rank holds `experts / ep` experts, each split over `etp`.
//! - Gradients as the parameters; under ZeRO-1 the optimizer state of each side is sharded
//!   over that side's own data-parallel group: the dense side over `dp`, the expert side over
//!   `edp` (`ceil(n / group)` each, the largest shard).
//! - Activations of an MoE layer's MLP part for `b s` tokens (2-byte activations, as
//!   Korthikanti et al.'s accounting; the router's probabilities in f32): a rank routes its
//!   sequence-parallel slice of `b s / tp` tokens (Megatron-Core's MoE layers take it under
//!   TP), keeps their router probabilities (`4 experts` bytes a token), and receives on
//!   average `b s / tp x top_k x capacity` token copies (the capacity factor: the padding of
//!   dropping routers, or the busiest rank's excess under dropless routing), each gathered
//!   over expert-TP (`etp` times the copies, each `1 / etp` of the hidden width): per copy
//!   its input `2d` (kept for the up projection's weight gradient), the expert's hidden
//!   tensors `2 ffn_e` each ([`crate::shape::MlpKind::hidden_tensors`]) and its output `2d`
//!   (kept for the combine's gradient by the router weights); the shared experts keep what a
//!   dense MLP of their width keeps, split over TP. Of the hidden tensors, the activation's
//!   output (`2 ffn_e` a copy) is what selective recomputation under fused attention
//!   rebuilds (Megatron-Core's `moe_act`), as it rebuilds a dense MLP's. The dispatch
//!   buffers, a send and a receive of the copies (`2 x 2d` per copy), live only while one
//!   layer dispatches: a transient beside the stash, not kept per microbatch.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::shape::{MlaShape, ModelShape, TpSplit};

/// How a configuration runs the experts: expert parallelism `ep`, expert tensor parallelism
/// `etp` (folded over a stage's `tp x dp` GPUs), and the capacity factor (1: even routing;
/// more: a dropping router's padding or a dropless router's busiest rank). All 1 for a dense
/// model, where they change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertLayout {
    /// Expert parallelism: each EP rank holds `experts / ep` routed experts.
    pub ep: u32,
    /// Expert tensor parallelism: each expert split over `etp` ranks.
    pub etp: u32,
    /// Capacity factor, at least 1.
    pub capacity: f64,
}

impl Default for ExpertLayout {
    fn default() -> Self {
        ExpertLayout {
            ep: 1,
            etp: 1,
            capacity: 1.0,
        }
    }
}

impl ExpertLayout {
    /// Expert data parallelism of a stage of `tp x dp` GPUs, `tp dp / (etp ep)`.
    pub fn edp(&self, tp: u32, dp: u32) -> u32 {
        (tp.max(1) * dp.max(1)) / (self.ep.max(1) * self.etp.max(1)).max(1)
    }
}

/// Parameters of one rank, by the side whose data-parallel group reduces them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideParameters {
    /// Attention, norms, router, shared experts and dense MLPs (reduced over `dp`).
    pub dense: u64,
    /// The routed experts this rank holds (reduced over expert-DP).
    pub expert: u64,
}

impl std::ops::Add for SideParameters {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        SideParameters {
            dense: self.dense + o.dense,
            expert: self.expert + o.expert,
        }
    }
}

/// Latent attention's parameters on one of `t` TP ranks (see the module's note).
fn mla_rank_parameters(m: &MlaShape, d: u64, heads: u64, norm_vectors: u64, t: u64) -> u64 {
    let qk = heads * m.qk_head_dim();
    let down = m.q_lora_rank.map_or(0, |r| d * r) + d * (m.kv_lora_rank + m.qk_rope_head_dim);
    let q_up = m.q_lora_rank.map_or(d * qk, |r| r * qk);
    let up = q_up + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim);
    let out = heads * m.v_head_dim * d;
    let norms = norm_vectors * (m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank);
    down + norms + (up + out) / t
}

/// Layer `i`'s parameters on one rank of `tp` x (`ep` x `etp`).
pub fn layer_rank_parameters(
    shape: &ModelShape,
    i: u32,
    tp: u32,
    ep: u32,
    etp: u32,
) -> SideParameters {
    let t = u64::from(tp.max(1));
    let [qkv, out, up, down] = shape.block_linears();
    let attention = match &shape.mla {
        Some(m) => mla_rank_parameters(
            m,
            shape.d_model,
            u64::from(shape.heads),
            shape.norm.vectors(),
            t,
        ),
        None => qkv.rank_parameters(t) + out.rank_parameters(t) + shape.qk_norm_parameters(),
    };
    let norms = 2 * shape.norm_parameters();
    let moe = shape.moe.filter(|m| m.is_moe_layer(i));
    let Some(m) = moe else {
        let mlp = up.rank_parameters(t) + down.rank_parameters(t);
        return SideParameters {
            dense: attention + norms + mlp,
            expert: 0,
        };
    };
    debug_assert!(matches!(
        (up.split, down.split),
        (TpSplit::Column, TpSplit::Row)
    ));
    let (d, ups) = (shape.d_model, shape.mlp.up_matrices());
    let shared = m.shared_parameters(d, ups) / t;
    let per_rank = u64::from(m.experts / ep.max(1));
    SideParameters {
        dense: attention + norms + m.router_parameters(d) + shared,
        expert: per_rank * m.expert_parameters(d, ups) / u64::from(etp.max(1)),
    }
}

/// The blocks `layers` (0-based) of a stage on one rank; the embedding, the LM head and the
/// final norm are the dense side's, as [`super::stage_parameters`] places them.
pub fn blocks_rank_parameters(
    shape: &ModelShape,
    layers: Range<u32>,
    tp: u32,
    ep: u32,
    etp: u32,
) -> SideParameters {
    layers
        .map(|i| layer_rank_parameters(shape, i, tp, ep, etp))
        .fold(SideParameters::default(), |a, b| a + b)
}

/// `(parameters, gradients, optimizer state)` bytes of a rank holding `p`, at `bytes` =
/// (weight, gradient, optimizer) bytes a parameter, with ZeRO-1 (`zero >= 1`) sharding each
/// side's optimizer state over its own data-parallel group, `dp` and `edp`.
pub fn state_bytes(
    p: SideParameters,
    dp: u32,
    edp: u32,
    zero: u8,
    bytes: (u64, u64, u64),
) -> (u64, u64, u64) {
    let (pw, gw, ow) = bytes;
    let n = p.dense + p.expert;
    let shard = |x: u64, group: u32| {
        if zero >= 1 {
            x.div_ceil(u64::from(group.max(1)))
        } else {
            x
        }
    };
    (
        pw * n,
        gw * n,
        ow * (shard(p.dense, dp) + shard(p.expert, edp)),
    )
}

/// An MoE layer's MLP-part activations on one rank for one microbatch (see the module's
/// note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeActivations {
    /// Bytes kept from the forward to the backward: router probabilities, the dispatched
    /// copies' inputs, hidden tensors and outputs, and the shared experts'.
    pub stash: u64,
    /// Of the stash, the activation's outputs (GeLU's output or a gated MLP's product,
    /// `2 ffn_e` a copy, and the shared experts' likewise): what selective recomputation
    /// under fused attention rebuilds from their kept inputs (Megatron-Core's `moe_act`).
    pub activation_output: u64,
    /// Bytes of the dispatch's send and receive buffers, alive while the layer dispatches.
    pub dispatch_buffers: u64,
}

/// The MLP part of MoE layer activations for `tokens` (`b s`) tokens on one rank of `tp` x
/// `etp`, with a `capacity` factor (1 for even routing); `None` for a shape without experts.
pub fn moe_activations(
    shape: &ModelShape,
    tokens: u64,
    tp: u32,
    etp: u32,
    capacity: f64,
) -> Option<MoeActivations> {
    let m = shape.moe?;
    let t = f64::from(tp.max(1));
    let routed = tokens as f64 / t;
    let copies = routed * f64::from(m.top_k) * capacity;
    let (d, hidden) = (shape.d_model as f64, shape.mlp.hidden_tensors() as f64);
    let per_copy = 2.0 * d * f64::from(etp.max(1)) + 2.0 * hidden * m.expert_ffn as f64 + 2.0 * d;
    let router = routed * 4.0 * f64::from(m.experts);
    let shared_width = f64::from(m.shared_experts) * m.shared_ffn as f64;
    let shared = tokens as f64 * 2.0 * hidden * shared_width / t;
    let stash = (router + copies * per_copy + shared).ceil() as u64;
    let outputs = copies * 2.0 * m.expert_ffn as f64 + tokens as f64 * 2.0 * shared_width / t;
    Some(MoeActivations {
        stash,
        activation_output: (outputs.floor() as u64).min(stash),
        dispatch_buffers: (copies * 2.0 * 2.0 * d).ceil() as u64,
    })
}

#[cfg(test)]
mod tests;
