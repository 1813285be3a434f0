//! The all-to-all of expert parallelism: what an MoE layer's token dispatch and combine move
//! per microbatch, and how long they take on the cluster's links. Pure functions, for the
//! cost model to charge to a stage as communication (which an overlapped F&B pair may hide).
//!
//! Parallel folding (Megatron-Core's MoE "parallel folding", Liu et al. 2025): a stage's
//! `tp x dp` GPUs run attention as TP `tp` x DP `dp`, and the same GPUs run the experts as
//! expert-TP `etp` x EP `ep` x expert-DP `tp dp / (etp ep)`. Within a stage the GPUs are
//! numbered `j = tp_rank + tp dp_rank` (global rank `tp_rank + tp (dp_rank + dp pp_rank)`,
//! as [`crate::comm`] and the runtime place them, so a stage's GPUs are consecutive) and the
//! expert side splits `j` as `etp_rank + etp (ep_rank + ep edp_rank)`, so an EP group is
//! every `etp`-th GPU of a run of `etp ep`.
//!
//! Volume (per GPU, one MoE layer, one microbatch of `b` sequences of `s` tokens): a GPU holds
//! `b s / tp` tokens (the sequence-parallel slice Megatron-Core's MoE layers take under TP);
//! the dispatch sends each to its `top_k` experts, `b s / tp x top_k x d` elements, scaled by
//! the capacity factor (the padding of dropping routers, or the imbalance of dropless ones:
//! the busiest GPU receives that much more than the mean); the combine returns as many. The
//! backward sends the gradients of both back the same way. Of these, the fraction bound for
//! the GPU's own experts, `1 / ep`, stays put. Expert-TP's own all-gather and reduce-scatter
//! of the dispatched tokens are not counted here.
//!
//! Time: the bytes for peers in the GPU's node go over the intra-node link, those for peers
//! on other nodes over the inter-node link (its own NIC), both at once, so the slower sets
//! the time; plus one latency per peer (a pairwise exchange), over the slower link's latency
//! where the group spans nodes.
//!
//! DeepEP's dispatch ([`Dispatcher::DeepEp`], DeepSeek-V3 report §3.2.2, and Megatron-Core's
//! `flex` dispatcher) sends a token over the inter-node link once per other node that holds
//! any of its experts, not once per expert, and forwards it over NVLink inside that node.
//! With the `E` experts spread evenly over the `N` nodes of an EP group and the `k` experts
//! of a token drawn evenly (an even router), a node holds none of them with probability
//! `C(E - E/N, k) / C(E, k)`, so a token reaches `N (1 - that)` nodes, `(N - 1) / N` of them
//! other nodes. Group-limited routing (DeepSeek's node-limited routing,
//! [`pipewright_model::shape::RouteGroups`]) draws a token's experts from `M` of `G` groups:
//! where each node holds whole groups, or each group whole nodes, the chance that a node
//! holds none of a token's experts follows from which groups are chosen (DeepSeek-V3 at EP
//! 64: a group a node, 3.6 nodes a token where unlimited routing would reach 5.3); where
//! groups and nodes do not nest, the limit is not counted. Under FP8
//! ([`Wire::fp8_dispatch`]) DeepEP dispatches FP8 (one byte an element and a 4-byte scale
//! per 128) and combines in bf16, forward and backward alike (DeepSeek-V3 report §3.3.2).

use std::ops::Range;

use pipewright_model::memory::ModelShape;
use pipewright_model::shape::MoeShape;

use super::cluster::Cluster;
use super::comm::global_rank;

/// How an MoE layer's tokens reach their experts' GPUs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Dispatcher {
    /// A plain all-to-all (pipewright's runtime, Megatron-Core's `alltoall`): one copy of a
    /// token for each of its experts on another GPU.
    #[default]
    #[serde(rename = "all-to-all")]
    AllToAll,
    /// DeepEP: one copy of a token over the inter-node link for each other node holding any
    /// of its experts, forwarded over NVLink inside it.
    #[serde(rename = "deepep")]
    DeepEp,
}

pipewright_kinds::named!(Dispatcher, "a dispatcher", AllToAll => "all-to-all", DeepEp => "deepep");

/// Why an expert fold does not fit, naming the fields (`ep`, `etp`), which each face
/// renders in its own words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    /// `ep` or `etp` of 0.
    #[error("ep and etp must be at least 1")]
    Zero,
    /// `ep` not dividing the experts.
    #[error("ep {ep} must divide the {experts} routed experts")]
    Experts {
        /// Expert parallelism.
        ep: u32,
        /// Routed experts.
        experts: u32,
    },
    /// `etp x ep` not dividing a stage's GPUs.
    #[error("etp {etp} x ep {ep} must divide a stage's tp {tp} x dp {dp} GPUs (expert parallelism folds over them)")]
    Group {
        /// Expert tensor parallelism.
        etp: u32,
        /// Expert parallelism.
        ep: u32,
        /// Tensor parallelism.
        tp: u32,
        /// Data parallelism.
        dp: u32,
    },
}

/// How a stage's `tp x dp` GPUs are folded for the experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertFold {
    /// Attention's tensor parallelism.
    pub tp: u32,
    /// Pipeline stages (devices), for where a stage's GPUs sit.
    pub pp: u32,
    /// Attention's data parallelism.
    pub dp: u32,
    /// Expert tensor parallelism.
    pub etp: u32,
    /// Expert parallelism.
    pub ep: u32,
}

impl ExpertFold {
    /// Expert data parallelism, `tp dp / (etp ep)`.
    pub fn edp(&self) -> u32 {
        (self.tp * self.dp) / (self.etp * self.ep).max(1)
    }

    /// Why this fold does not fit `experts` routed experts; `None` where it does: EP
    /// divides the experts, and `etp x ep` divides the stage's `tp x dp` GPUs.
    pub fn refusal(&self, experts: u32) -> Option<FoldError> {
        let (etp, ep) = (self.etp, self.ep);
        let group = u64::from(self.tp) * u64::from(self.dp);
        if etp == 0 || ep == 0 {
            return Some(FoldError::Zero);
        }
        if experts % ep != 0 {
            return Some(FoldError::Experts { ep, experts });
        }
        if group % (u64::from(etp) * u64::from(ep)) != 0 {
            return Some(FoldError::Group {
                etp,
                ep,
                tp: self.tp,
                dp: self.dp,
            });
        }
        None
    }

    /// Node of stage-local GPU `j` of pipeline stage `pp_rank`.
    fn node(&self, cluster: &Cluster, pp_rank: u64, j: u64) -> u64 {
        let tp = u64::from(self.tp.max(1));
        let (t, d) = (j % tp, j / tp);
        let global = global_rank(self.tp.max(1), self.dp, t, d, pp_rank);
        global / u64::from(cluster.gpus_per_node.max(1))
    }

    /// The fewest peers a GPU has on its own node within its EP group, over the groups
    /// (placement repeats, so the first few of each kind are checked; the worst group sets
    /// the pace of an all-to-all every group runs at once).
    pub fn peers_in_node(&self, cluster: &Cluster) -> u32 {
        // The plan asks this of every candidate it bounds, and the walk below is thousands
        // of steps for a wide EP: remembered per fold and node size.
        thread_local! {
            static SEEN: std::cell::RefCell<std::collections::HashMap<(ExpertFold, u32), u32>> =
                Default::default();
        }
        let key = (*self, cluster.gpus_per_node);
        if let Some(n) = SEEN.with(|m| m.borrow().get(&key).copied()) {
            return n;
        }
        let n = self.walk_peers_in_node(cluster);
        SEEN.with(|m| m.borrow_mut().insert(key, n));
        n
    }

    fn walk_peers_in_node(&self, cluster: &Cluster) -> u32 {
        let (etp, ep) = (u64::from(self.etp.max(1)), u64::from(self.ep.max(1)));
        // Placement repeats within a node's width: that many stages and groups cover it.
        let few = |n: u32| u64::from(n.clamp(1, cluster.gpus_per_node.max(1)));
        let mut least = self.ep.max(1) - 1;
        for pp_rank in 0..few(self.pp) {
            for edp in 0..few(self.edp()) {
                for offset in 0..etp.min(u64::from(cluster.gpus_per_node.max(1))) {
                    let base = offset + etp * ep * edp;
                    // Global rank grows with `j`, so a group's nodes come in runs.
                    let mut run = 0u32;
                    let mut last = None;
                    for e in 0..ep {
                        let n = self.node(cluster, pp_rank, base + e * etp);
                        if last.is_some_and(|l| l != n) {
                            least = least.min(run - 1);
                            run = 0;
                        }
                        last = Some(n);
                        run += 1;
                    }
                    least = least.min(run.saturating_sub(1));
                }
            }
        }
        least
    }
}

/// One MoE layer's all-to-all traffic and time for one microbatch, on one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllToAll {
    /// Bytes one combine hands the all-to-all on one GPU, its own experts' share included:
    /// `b s / tp x top_k x d x bytes x capacity` (a dispatch moves as many, or its FP8 form).
    pub bytes: f64,
    /// Of those, the bytes that leave the GPU for peers on its node.
    pub intra_bytes: f64,
    /// Of those, the bytes that leave the GPU for peers on other nodes.
    pub inter_bytes: f64,
    /// Seconds of one combine.
    pub one_s: f64,
    /// Bytes of one dispatch (`bytes`, or its FP8 form under [`Wire::fp8_dispatch`]).
    pub dispatch_bytes: f64,
    /// Seconds of one dispatch.
    pub dispatch_s: f64,
}

impl AllToAll {
    /// Forward seconds: a dispatch and a combine.
    pub fn forward_s(&self) -> f64 {
        self.dispatch_s + self.one_s
    }

    /// Backward seconds: the gradients of the combine (dispatched) and of the dispatch
    /// (combined), the same volumes.
    pub fn backward_s(&self) -> f64 {
        self.dispatch_s + self.one_s
    }
}

/// How an MoE layer's tokens travel: the bytes of an activation, the capacity factor (1 for
/// even routing), the dispatcher, and whether the dispatch is FP8 (DeepEP under `--fp8`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wire {
    /// Bytes of one activation element (the combine's, and a plain dispatch's).
    pub act_bytes: u64,
    /// The capacity factor.
    pub capacity: f64,
    /// The dispatcher.
    pub dispatcher: Dispatcher,
    /// DeepEP dispatches FP8: one byte an element and a 4-byte scale per 128.
    pub fp8_dispatch: bool,
}

/// One MoE layer's all-to-all for a microbatch of `microbatch_size` sequences travelling as
/// `wire` says, under `fold`; `None` for a shape without experts. Zero where `ep` is 1 (no
/// token leaves its GPU).
pub fn layer_all_to_all(
    shape: &ModelShape,
    cluster: &Cluster,
    fold: &ExpertFold,
    microbatch_size: u64,
    wire: Wire,
) -> Option<AllToAll> {
    let moe = shape.moe?;
    let tokens = microbatch_size as f64 * shape.seq_len as f64 / f64::from(fold.tp.max(1));
    let elements = tokens * f64::from(moe.top_k) * shape.d_model as f64 * wire.capacity;
    let ep = fold.ep.max(1);
    let near = fold.peers_in_node(cluster).min(ep - 1);
    let far = ep - 1 - near;
    let (intra, inter) = (&cluster.intra_node, &cluster.inter_node);
    let latency = match (near, far) {
        (0, 0) => 0.0,
        (_, 0) => f64::from(near) * intra.latency_s(),
        _ => f64::from(ep - 1) * inter.latency_s().max(intra.latency_s()),
    };
    let one = |bytes: f64| {
        let share = |peers: u32| bytes * f64::from(peers) / f64::from(ep);
        let (intra_bytes, inter_bytes) = match wire.dispatcher {
            Dispatcher::DeepEp if far > 0 => deepep_bytes(bytes, &moe, ep, near),
            _ => (share(near), share(far)),
        };
        let s = (intra_bytes / intra.bytes_per_s()).max(inter_bytes / inter.bytes_per_s());
        (intra_bytes, inter_bytes, s + latency)
    };
    let bytes = elements * wire.act_bytes as f64;
    let dispatch_bytes = match wire.dispatcher {
        Dispatcher::DeepEp if wire.fp8_dispatch => elements * (1.0 + 4.0 / 128.0),
        _ => bytes,
    };
    let (intra_bytes, inter_bytes, one_s) = one(bytes);
    Some(AllToAll {
        bytes,
        intra_bytes,
        inter_bytes,
        one_s,
        dispatch_bytes,
        dispatch_s: one(dispatch_bytes).2,
    })
}

/// DeepEP's (intra-node, inter-node) bytes of a dispatch of `bytes` (every copy, `top_k` a
/// token) over an EP group of `ep` GPUs, `near + 1` of them on each node: a token crosses to
/// each other node its experts are on once, and every copy bound for another GPU of the node
/// it lands on (its own, or the one it crossed to) moves over NVLink. The nodes are counted
/// from the worst group's GPUs on one node, as the plain all-to-all paces by that group: a
/// group split unevenly over nodes counts more nodes than it spans (more bytes, not fewer).
fn deepep_bytes(bytes: f64, moe: &MoeShape, ep: u32, near: u32) -> (f64, f64) {
    let per_node = near + 1;
    let nodes = ep.div_ceil(per_node);
    let reached = node_reached(moe, nodes);
    let other_nodes = f64::from(nodes - 1) * reached;
    let copy = bytes / f64::from(moe.top_k);
    let inter = copy * other_nodes;
    let intra = bytes * f64::from(per_node - 1) / f64::from(per_node);
    (intra, inter)
}

/// The chance that a token's experts include one on a given node of `nodes` holding the
/// routed experts evenly, under the router's groups where they nest with the nodes (see the
/// module's note).
pub fn node_reached(moe: &MoeShape, nodes: u32) -> f64 {
    let (e, k) = (f64::from(moe.experts), moe.top_k);
    let on_node = e / f64::from(nodes);
    let Some(g) = moe.route_groups.filter(|g| g.per_token < g.groups) else {
        return 1.0 - none_of(e, on_node, k);
    };
    let (groups, chosen) = (g.groups, g.per_token);
    // The experts a token may draw from: its chosen groups'.
    let pool = f64::from(chosen) * e / f64::from(groups);
    if groups % nodes == 0 {
        // Each node holds `per` whole groups; `c` of them chosen, hypergeometrically.
        let per = groups / nodes;
        (0..=per.min(chosen))
            .map(|c| {
                let p = choose(per, c) * choose(groups - per, chosen - c) / choose(groups, chosen);
                let held = f64::from(c) * e / f64::from(groups);
                p * (1.0 - none_of(pool, held, k))
            })
            .sum()
    } else if nodes % groups == 0 {
        // Each group spans whole nodes: the node's group is chosen, then holds some.
        let group_chosen = f64::from(chosen) / f64::from(groups);
        group_chosen * (1.0 - none_of(pool, on_node, k))
    } else {
        1.0 - none_of(e, on_node, k)
    }
}

/// `C(pool - held, k) / C(pool, k)`: the chance that none of `k` draws without replacement
/// from `pool` falls among `held` of them.
fn none_of(pool: f64, held: f64, k: u32) -> f64 {
    (0..k).fold(1.0, |p, i| {
        let i = f64::from(i);
        p * ((pool - held - i) / (pool - i)).max(0.0)
    })
}

/// `C(n, r)` as a float (small `n`: a router's groups).
fn choose(n: u32, r: u32) -> f64 {
    if r > n {
        return 0.0;
    }
    (0..r).fold(1.0, |c, i| c * f64::from(n - i) / f64::from(i + 1))
}

/// A stage's all-to-all per microbatch: its MoE layers among `layers` (0-based indices of
/// the model's blocks), each one `one` (a [`layer_all_to_all`]). `(forward_s, backward_s,
/// bytes)`, the bytes being all four all-to-alls' (dispatch and combine, forward and
/// backward) of every MoE layer of the stage; zeros for a stage without MoE layers.
pub fn stage_all_to_all(shape: &ModelShape, layers: Range<u32>, one: &AllToAll) -> (f64, f64, f64) {
    let moe = layers.filter(|&i| shape.is_moe_layer(i)).count() as f64;
    (
        moe * one.forward_s(),
        moe * one.backward_s(),
        moe * 2.0 * (one.bytes + one.dispatch_bytes),
    )
}

#[cfg(test)]
mod tests;
