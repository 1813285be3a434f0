use super::*;
use crate::cluster::Link;
use pipewright_model::shape::{MlpKind, MoeShape, RouteGroups};

/// 8 GPUs a node, NVLink 100 GB/s and 5 us, a NIC of 25 GB/s and 10 us per GPU.
fn cluster() -> Cluster {
    Cluster {
        gpus_per_node: 8,
        intra_node: Link {
            bandwidth_gbs: 100.0,
            latency_us: 5.0,
        },
        inter_node: Link {
            bandwidth_gbs: 25.0,
            latency_us: 10.0,
        },
        ..Cluster::preset("a100-80g").unwrap()
    }
}

/// d 4096, sequences of 4096 tokens, 8 experts of which 2 a token; the first layer dense.
fn shape() -> ModelShape {
    ModelShape {
        mlp: MlpKind::SwiGlu,
        moe: Some(MoeShape {
            route_groups: None,
            experts: 8,
            top_k: 2,
            expert_ffn: 14336,
            shared_experts: 0,
            shared_ffn: 0,
            shared_gate: false,
            router_bias: false,
            dense_layers: 1,
            every: 1,
        }),
        ..ModelShape::gpt(4, 4096, 32, 14336, 4096, 32000)
    }
}

fn wire(act_bytes: u64, capacity: f64, dispatcher: Dispatcher) -> Wire {
    Wire {
        act_bytes,
        capacity,
        dispatcher,
        fp8_dispatch: false,
    }
}

fn fold(tp: u32, pp: u32, dp: u32, etp: u32, ep: u32) -> ExpertFold {
    ExpertFold {
        tp,
        pp,
        dp,
        etp,
        ep,
    }
}

/// One sequence's dispatch in bf16: 4096 tokens x 2 experts x 4096 x 2 bytes.
const B: f64 = 4096.0 * 2.0 * 4096.0 * 2.0;

#[test]
fn ep_within_a_node_sends_all_but_its_own_share_over_nvlink() {
    let a = layer_all_to_all(
        &shape(),
        &cluster(),
        &fold(1, 1, 8, 1, 8),
        1,
        wire(2, 1.0, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(a.bytes, B);
    assert_eq!(a.intra_bytes, B * 7.0 / 8.0);
    assert_eq!(a.inter_bytes, 0.0);
    let one = B * 7.0 / 8.0 / 100e9 + 7.0 * 5e-6;
    assert!((a.one_s - one).abs() < 1e-15, "{} vs {one}", a.one_s);
    assert_eq!(a.forward_s(), 2.0 * a.one_s);
    assert_eq!(a.backward_s(), 2.0 * a.one_s);
}

#[test]
fn ep_across_nodes_is_paced_by_the_nic() {
    // EP 16 over two nodes: 7 peers on NVLink, 8 over the NIC, at once.
    let a = layer_all_to_all(
        &shape(),
        &cluster(),
        &fold(1, 1, 16, 1, 16),
        1,
        wire(2, 1.0, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(a.intra_bytes, B * 7.0 / 16.0);
    assert_eq!(a.inter_bytes, B * 8.0 / 16.0);
    let one = (B * 8.0 / 16.0 / 25e9) + 15.0 * 10e-6;
    assert!((a.one_s - one).abs() < 1e-15);
    // The runtime's placement keeps a stage's GPUs consecutive: under pp 2, stage 0 is ranks
    // 0..8 and stage 1 ranks 8..16, so EP 8 stays on one node.
    let f = fold(1, 2, 8, 1, 8);
    assert_eq!(f.peers_in_node(&cluster()), 7);
    let a = layer_all_to_all(
        &shape(),
        &cluster(),
        &f,
        1,
        wire(2, 1.0, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(a.inter_bytes, 0.0);
    // EP 6 over dp 12: stage 0's second group is ranks 6..12, two on node 0 and four on node 1,
    // and that worst group sets the pace: one peer on a GPU's node.
    let f = fold(1, 2, 12, 1, 6);
    assert_eq!(f.peers_in_node(&cluster()), 1);
    let a = layer_all_to_all(
        &shape(),
        &cluster(),
        &f,
        1,
        wire(2, 1.0, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(a.inter_bytes, B * 4.0 / 6.0);
}

#[test]
fn tp_slices_the_tokens_and_capacity_scales_the_volume() {
    // Sequence-parallel slices: each of tp 2 GPUs dispatches half the tokens; EP 8 folds
    // over the 16 GPUs of the stage (expert-DP 2).
    let f = fold(2, 1, 8, 1, 8);
    assert_eq!(f.edp(), 2);
    assert_eq!(f.peers_in_node(&cluster()), 7);
    let a = layer_all_to_all(
        &shape(),
        &cluster(),
        &f,
        1,
        wire(2, 1.25, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(a.bytes, B / 2.0 * 1.25);
    // No all-to-all without EP, none without experts.
    let one = layer_all_to_all(
        &shape(),
        &cluster(),
        &fold(1, 1, 8, 1, 1),
        4,
        wire(2, 1.0, Dispatcher::AllToAll),
    )
    .unwrap();
    assert_eq!(one.one_s, 0.0);
    let dense = ModelShape {
        moe: None,
        ..shape()
    };
    assert!(layer_all_to_all(
        &dense,
        &cluster(),
        &f,
        1,
        wire(2, 1.0, Dispatcher::AllToAll)
    )
    .is_none());
}

#[test]
fn a_stage_pays_for_its_moe_layers_only() {
    let (c, f) = (cluster(), fold(1, 1, 8, 1, 8));
    let a = layer_all_to_all(&shape(), &c, &f, 2, wire(2, 1.0, Dispatcher::AllToAll)).unwrap();
    // Layers 0..3: layer 0 is dense, 1 and 2 are MoE layers.
    let (fwd, bwd, bytes) = stage_all_to_all(&shape(), 0..3, &a);
    assert_eq!((fwd, bwd), (2.0 * a.forward_s(), 2.0 * a.backward_s()));
    assert_eq!(bytes, 2.0 * 4.0 * 2.0 * B);
    assert_eq!(stage_all_to_all(&shape(), 0..1, &a), (0.0, 0.0, 0.0));
}

#[test]
fn a_fold_that_does_not_fit_is_refused_naming_it() {
    assert_eq!(
        fold(1, 1, 8, 1, 3).refusal(8).unwrap().to_string(),
        "ep 3 must divide the 8 routed experts"
    );
    assert_eq!(
        fold(1, 1, 8, 2, 8).refusal(8).unwrap().to_string(),
        "etp 2 x ep 8 must divide a stage's tp 1 x dp 8 GPUs (expert parallelism folds over them)"
    );
    assert_eq!(fold(2, 1, 4, 2, 4).refusal(8), None);
}

/// `experts` experts of which `top_k` a token, over EP `ep` on nodes of 8.
fn mixture(experts: u32, top_k: u32, ep: u32) -> (ModelShape, ExpertFold) {
    let mut s = shape();
    s.moe = s.moe.map(|m| MoeShape {
        route_groups: None,
        experts,
        top_k,
        ..m
    });
    (s, fold(1, 1, ep, 1, ep))
}

fn deepep(experts: u32, top_k: u32, ep: u32) -> (AllToAll, AllToAll) {
    let (s, f) = mixture(experts, top_k, ep);
    let run = |d| layer_all_to_all(&s, &cluster(), &f, 1, wire(2, 1.0, d)).unwrap();
    (run(Dispatcher::AllToAll), run(Dispatcher::DeepEp))
}

#[test]
fn deepep_crosses_to_a_node_once_a_token() {
    // One expert a token: one copy either way; half of them go to the other node.
    let (plain, deep) = deepep(16, 1, 16);
    assert!((deep.inter_bytes - plain.inter_bytes).abs() < 1e-6 * plain.inter_bytes);
    assert_eq!(plain.inter_bytes, plain.bytes * 8.0 / 16.0);
    // 9 of 16 experts: every token has experts on both nodes, and crosses once, not 9 x 8/16
    // times.
    let (plain, deep) = deepep(16, 9, 16);
    let copy = plain.bytes / 9.0;
    assert!((deep.inter_bytes - copy).abs() < 1e-9 * copy);
    assert!((plain.inter_bytes - 4.5 * copy).abs() < 1e-9 * copy);
    // Every copy bound for another GPU of the node it lands on moves over NVLink: 7 of 8.
    assert!((deep.intra_bytes - plain.bytes * 7.0 / 8.0).abs() < 1e-9 * plain.bytes);
    assert!(deep.one_s < plain.one_s);
    // DeepSeek-V3's 256 experts, 8 a token, over EP 64 on 8 nodes: 1 - C(224,8)/C(256,8) of
    // the nodes hold one of a token's experts, 4.63 other nodes a token against 7 copies.
    let (plain, deep) = deepep(256, 8, 64);
    let copy = plain.bytes / 8.0;
    assert!((plain.inter_bytes / copy - 7.0).abs() < 1e-9);
    assert!(
        (deep.inter_bytes / copy - 4.6328205).abs() < 1e-6,
        "{}",
        deep.inter_bytes / copy
    );
    // Inside one node there is nothing to de-duplicate.
    let (plain, deep) = deepep(8, 2, 8);
    assert_eq!(plain, deep);
}

#[test]
fn node_limited_routing_reaches_fewer_nodes() {
    // DeepSeek-V3: 256 experts in 8 groups, a token's 8 from its best 4; EP 64 on 8 nodes
    // puts a group on a node. A node is reached when its group is chosen (4 of 8) and holds
    // one of the 8 drawn from the chosen groups' 128: 1/2 x (1 - C(96,8)/C(128,8)).
    let (mut s, f) = mixture(256, 8, 64);
    let unlimited = node_reached(&s.moe.unwrap(), 8);
    s.moe = s.moe.map(|m| MoeShape {
        route_groups: Some(RouteGroups {
            groups: 8,
            per_token: 4,
        }),
        ..m
    });
    let m = s.moe.unwrap();
    let none: f64 = (0..8)
        .map(|i| f64::from(96 - i) / f64::from(128 - i))
        .product();
    assert!((node_reached(&m, 8) - 0.5 * (1.0 - none)).abs() < 1e-12);
    assert!(
        (8.0 * unlimited - 5.2946).abs() < 1e-3,
        "{}",
        8.0 * unlimited
    );
    // Two groups a node (16 groups, 4 nodes), 4 of them chosen: fewer nodes than unlimited.
    let two = MoeShape {
        route_groups: Some(RouteGroups {
            groups: 16,
            per_token: 4,
        }),
        ..m
    };
    let r = node_reached(&two, 4);
    assert!(r > 0.0 && r < 1.0 - none_of(256.0, 64.0, 8), "{r}");
    // A group over two nodes (8 groups, 16 nodes): the node's group is chosen (4 of 8), and
    // then holds one of the 8 drawn from 128 with 16 of them: 1 - C(112,8)/C(128,8).
    let half: f64 = (0..8)
        .map(|i| f64::from(112 - i) / f64::from(128 - i))
        .product();
    assert!((node_reached(&m, 16) - 0.5 * (1.0 - half)).abs() < 1e-12);
    // Nodes that split groups unevenly (3 nodes, 8 groups) fall back to unlimited routing.
    assert_eq!(node_reached(&m, 3), 1.0 - none_of(256.0, 256.0 / 3.0, 8));
    // The dispatch's inter-node bytes follow: 7 other nodes x 0.45 a token, not 4.63.
    let run = |s: &ModelShape| {
        let w = wire(2, 1.0, Dispatcher::DeepEp);
        layer_all_to_all(s, &cluster(), &f, 1, w).unwrap()
    };
    let limited = run(&s);
    let copy = limited.bytes / 8.0;
    assert!((limited.inter_bytes / copy - 7.0 * node_reached(&m, 8)).abs() < 1e-9);
}

#[test]
fn deepep_dispatches_fp8_and_combines_in_bf16() {
    let (s, f) = mixture(256, 8, 64);
    let w = Wire {
        fp8_dispatch: true,
        ..wire(2, 1.0, Dispatcher::DeepEp)
    };
    let a = layer_all_to_all(&s, &cluster(), &f, 1, w).unwrap();
    assert_eq!(a.dispatch_bytes, a.bytes / 2.0 * (1.0 + 4.0 / 128.0));
    assert!(a.dispatch_s < a.one_s);
    assert_eq!(a.forward_s(), a.dispatch_s + a.one_s);
    // A plain all-to-all moves bf16 both ways: FP8 dispatch is DeepEP's.
    let plain = Wire {
        fp8_dispatch: true,
        ..wire(2, 1.0, Dispatcher::AllToAll)
    };
    let p = layer_all_to_all(&s, &cluster(), &f, 1, plain).unwrap();
    assert_eq!((p.dispatch_bytes, p.dispatch_s), (p.bytes, p.one_s));
}
