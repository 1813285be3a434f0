//! Communication: ring collectives and point-to-point sends over the links a configuration's
//! placement puts them on.
//!
//! Placement is the runtime's (`Mesh`, as Megatron-Core's default order): global rank `=
//! tp_rank + tp * (dp_rank + dp * pp_rank)`, so a TP group is `tp` neighbouring GPUs (inside
//! one node when `tp` divides the node), data-parallel replicas come next, and pipeline stages
//! are outermost. The launch line runs this placement, so the plan costs the one it launches.
//! Node of a rank: `rank / gpus_per_node`.
//!
//! Ring formulas (Patarasuk and Yuan 2009; what NCCL's ring achieves for large messages), for
//! `n` ranks, a buffer of `B` bytes, link bandwidth `beta` and per-step latency `alpha`:
//! - all-reduce: `2 (n-1)/n * B / beta + 2 (n-1) alpha`;
//! - reduce-scatter and all-gather: `(n-1)/n * B / beta + (n-1) alpha`.
//!
//! A collective whose group spans nodes runs at the inter-node link's rate: each GPU has its
//! own NIC, and the ring's slowest hop sets its pace.

use super::cluster::{Cluster, Link};

/// Global rank of a GPU at `tp_rank`, `dp_rank` and pipeline stage `pp_rank` of a `tp` x `dp`
/// x pp mesh: the runtime's placement (see the module docs), the one every placement question
/// here answers from.
pub fn global_rank(tp: u32, dp: u32, tp_rank: u64, dp_rank: u64, pp_rank: u64) -> u64 {
    tp_rank + u64::from(tp) * (dp_rank + u64::from(dp) * pp_rank)
}

/// Ring all-reduce of `bytes` over `n` ranks.
pub fn all_reduce(link: &Link, n: u32, bytes: f64) -> f64 {
    2.0 * reduce_scatter(link, n, bytes)
}

/// Ring reduce-scatter (or all-gather) of a `bytes` buffer over `n` ranks.
pub fn reduce_scatter(link: &Link, n: u32, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let k = f64::from(n - 1);
    k / f64::from(n) * bytes / link.bytes_per_s() + k * link.latency_s()
}

/// Where a configuration's groups sit, and so which link each uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Links {
    /// The TP group's link.
    pub tp: Link,
    /// Whether the TP group spans nodes.
    pub tp_cross_node: bool,
    /// The DP group's link.
    pub dp: Link,
}

impl Links {
    /// Links of `tp` x `pp` x `dp` on `cluster`.
    pub fn new(cluster: &Cluster, tp: u32, pp: u32, dp: u32) -> Links {
        let gpn = cluster.gpus_per_node;
        let tp_cross_node = tp > gpn || gpn % tp != 0;
        // A DP group is `tp dp` consecutive ranks (stride `tp`), one run per pipeline stage
        // from rank `tp dp s`: it leaves its node when the run is longer than a node, or when
        // some stage's run straddles two (its start modulo a node repeats within a node's
        // GPUs, so those stages are the ones to check).
        let run = u64::from(tp) * u64::from(dp);
        let gpn64 = u64::from(gpn.max(1));
        let straddles = |s: u64| global_rank(tp, dp, 0, 0, s) % gpn64 + run > gpn64;
        let dp_cross_node = dp > 1 && (run > gpn64 || (0..u64::from(pp).min(gpn64)).any(straddles));
        Links {
            tp: if tp_cross_node {
                cluster.inter_node
            } else {
                cluster.intra_node
            },
            tp_cross_node,
            dp: if dp_cross_node {
                cluster.inter_node
            } else {
                cluster.intra_node
            },
        }
    }
}

/// Whether pipeline devices `a` and `b` of some replica sit on different nodes (checked over
/// the first replicas whose alignment to nodes differs; replica `k`'s device `d` holds ranks
/// from `tp * (k + dp * d)`).
pub fn crosses_nodes(cluster: &Cluster, tp: u32, dp: u32, a: u32, b: u32) -> bool {
    let gpn = u64::from(cluster.gpus_per_node);
    let node = |d: u32, k: u64| global_rank(tp, dp, 0, k, u64::from(d)) / gpn;
    // Alignment repeats after gpn replicas at most.
    (0..u64::from(dp).min(gpn)).any(|k| node(a, k) != node(b, k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::a100_80g;

    #[test]
    fn ring_all_reduce_moves_twice_the_buffer_in_the_limit() {
        let link = Link {
            bandwidth_gbs: 1.0,
            latency_us: 0.0,
        };
        assert_eq!(all_reduce(&link, 1, 1e9), 0.0);
        assert!((all_reduce(&link, 2, 1e9) - 1.0).abs() < 1e-12);
        assert!((all_reduce(&link, 1000, 1e9) - 2.0 * 0.999).abs() < 1e-12);
    }

    #[test]
    fn placement_is_the_runtimes_tp_then_dp_then_pp() {
        let c = a100_80g();
        let l = Links::new(&c, 8, 64, 6);
        assert_eq!(l.tp, c.intra_node);
        assert_eq!(l.dp, c.inter_node);
        // tp 8: every pipeline neighbour is another node.
        assert!(crosses_nodes(&c, 8, 6, 0, 1));
        // tp 4: devices 0 and 1 share a node, 1 and 2 do not.
        assert!(!crosses_nodes(&c, 4, 1, 0, 1));
        assert!(crosses_nodes(&c, 4, 1, 1, 2));
        // A stage's whole DP group in one node: DP over NVLink.
        let l = Links::new(&c, 2, 2, 2);
        assert_eq!(l.dp, c.intra_node);
        // tp 2 x dp 4 fills a node: DP stays on it, and pipeline neighbours leave it.
        assert_eq!(Links::new(&c, 2, 4, 4).dp, c.intra_node);
        assert!(crosses_nodes(&c, 2, 4, 0, 1));
        // tp 2 x dp 3 = 6 GPUs: the next stage's DP group straddles two nodes.
        assert_eq!(Links::new(&c, 2, 2, 3).dp, c.inter_node);
        // dp 3 x pp 2 = 6 GPUs fit one node: runs that do not tile a node need not straddle.
        assert_eq!(Links::new(&c, 1, 2, 3).dp, c.intra_node);
        assert_eq!(Links::new(&c, 1, 3, 3).dp, c.inter_node);
        // Replica 0's devices 0 and 1 (ranks 0, 6) share a node; replica 1's (2, 8) do not.
        assert!(crosses_nodes(&c, 2, 3, 0, 1));
        assert!(Links::new(&c, 16, 1, 1).tp_cross_node);
    }
}
