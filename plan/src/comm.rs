//! Communication: ring collectives and point-to-point sends over the links a configuration's
//! placement puts them on.
//!
//! Placement follows practice: global rank `= tp_rank + tp * (pp_rank + pp * dp_rank)`, so a
//! TP group is `tp` neighbouring GPUs (inside one node when `tp` divides the node), pipeline
//! neighbours come next, and data-parallel replicas are outermost. Node of a rank: `rank /
//! gpus_per_node`.
//!
//! Ring formulas (Patarasuk and Yuan 2009; what NCCL's ring achieves for large messages), for
//! `n` ranks, a buffer of `B` bytes, link bandwidth `beta` and per-step latency `alpha`:
//! - all-reduce: `2 (n-1)/n * B / beta + 2 (n-1) alpha`;
//! - reduce-scatter and all-gather: `(n-1)/n * B / beta + (n-1) alpha`.
//!
//! A collective whose group spans nodes runs at the inter-node link's rate: each GPU has its
//! own NIC, and the ring's slowest hop sets its pace.

use super::cluster::{Cluster, Link};

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
        let per_replica = tp * pp;
        let dp_cross_node = dp > 1 && per_replica.saturating_mul(dp) > gpn;
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
/// from `tp * (d + pp * k)`).
pub fn crosses_nodes(cluster: &Cluster, tp: u32, pp: u32, dp: u32, a: u32, b: u32) -> bool {
    let gpn = u64::from(cluster.gpus_per_node);
    let (tp, pp) = (u64::from(tp), u64::from(pp));
    let node = |d: u32, k: u64| tp * (u64::from(d) + pp * k) / gpn;
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
    fn placement_puts_tp_in_a_node_and_pp_across() {
        let c = a100_80g();
        let l = Links::new(&c, 8, 64, 6);
        assert_eq!(l.tp, c.intra_node);
        assert_eq!(l.dp, c.inter_node);
        // tp 8: every pipeline neighbour is another node.
        assert!(crosses_nodes(&c, 8, 64, 6, 0, 1));
        // tp 4: devices 0 and 1 share a node, 1 and 2 do not.
        assert!(!crosses_nodes(&c, 4, 16, 1, 0, 1));
        assert!(crosses_nodes(&c, 4, 16, 1, 1, 2));
        // A whole replica in one node: DP over NVLink.
        let l = Links::new(&c, 2, 2, 2);
        assert_eq!(l.dp, c.intra_node);
        assert!(Links::new(&c, 16, 1, 1).tp_cross_node);
    }
}
