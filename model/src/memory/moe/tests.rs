use super::*;
use crate::shape::{BiasKind, MlpKind, MoeShape, NormKind, PositionKind};

/// 3 layers, the first dense; 4 SwiGLU experts of width 6 (2 a token), one shared expert of
/// width 5; d 8, 2 heads, dense MLP 12, RMSNorm, no biases, vocabulary 10, 4 tokens.
fn tiny() -> ModelShape {
    ModelShape {
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: PositionKind::Rotary,
        bias: BiasKind::None,
        moe: Some(MoeShape {
            experts: 4,
            top_k: 2,
            expert_ffn: 6,
            shared_experts: 1,
            shared_ffn: 5,
            shared_gate: false,
            router_bias: false,
            dense_layers: 1,
            every: 1,
        }),
        ..ModelShape::gpt(3, 8, 2, 12, 4, 10)
    }
}

#[test]
fn each_side_is_split_its_own_way() {
    let s = tiny();
    // tp 2: QKV 8 x 24 and the out projection 8 x 8 halved (96 + 32), two norms 16 whole.
    // Dense layer: up 8 x 24 and down 12 x 8 halved (96 + 48).
    let dense = SideParameters {
        dense: 128 + 16 + 144,
        expert: 0,
    };
    assert_eq!(layer_rank_parameters(&s, 0, 2, 2, 1), dense);
    // MoE layer: the router 8 x 4 whole, the shared expert 3 x 8 x 5 halved; 2 of the 4
    // experts (3 x 8 x 6 each) on each of ep 2, whole under etp 1, halved under etp 2.
    let moe = |etp: u64| SideParameters {
        dense: 128 + 16 + 32 + 60,
        expert: 2 * 144 / etp,
    };
    assert_eq!(layer_rank_parameters(&s, 1, 2, 2, 1), moe(1));
    assert_eq!(layer_rank_parameters(&s, 2, 2, 2, 2), moe(2));
    let blocks = blocks_rank_parameters(&s, 0..3, 2, 2, 1);
    assert_eq!(blocks, dense + moe(1) + moe(1));
    // Whole on one rank: the shape's own count of the blocks.
    let whole = blocks_rank_parameters(&s, 0..3, 1, 1, 1);
    let ends = s.embedding_parameters() + s.norm_parameters() + s.head_parameters(false);
    assert_eq!(whole.dense + whole.expert + ends, s.parameters());
}

#[test]
fn zero_1_shards_each_side_over_its_own_data_parallel_group() {
    let p = blocks_rank_parameters(&tiny(), 0..3, 2, 2, 1);
    assert_eq!(
        p,
        SideParameters {
            dense: 760,
            expert: 576
        }
    );
    let bf16 = (2, 4, 12);
    // tp 2 x dp 2 folded as ep 2 x edp 2.
    assert_eq!(
        state_bytes(p, 2, 2, 1, bf16),
        (2 * 1336, 4 * 1336, 12 * (380 + 288))
    );
    // tp 2 x dp 4 as ep 2 x edp 4: the dense side over 4, the experts over 4.
    assert_eq!(state_bytes(p, 4, 4, 1, bf16).2, 12 * (190 + 144));
    assert_eq!(state_bytes(p, 4, 4, 0, bf16).2, 12 * 1336);
}

#[test]
fn latent_attention_keeps_its_down_projections_whole_under_tp() {
    let s = ModelShape {
        mla: Some(crate::shape::MlaShape {
            q_lora_rank: Some(3),
            kv_lora_rank: 4,
            qk_nope_head_dim: 2,
            qk_rope_head_dim: 2,
            v_head_dim: 3,
        }),
        ..tiny()
    };
    // Down 8 x 3 + 8 x 6 and norms 3 + 4 whole; up 3 x 8, 4 x 10 and out 6 x 8 halved.
    let attention = 72 + 7 + (24 + 40 + 48) / 2;
    assert_eq!(
        layer_rank_parameters(&s, 0, 2, 1, 1).dense,
        attention + 16 + 144
    );
    assert_eq!(
        layer_rank_parameters(&s, 0, 1, 1, 1).dense,
        s.attention_parameters() + 16 + 288
    );
}

#[test]
fn activations_count_the_dispatched_copies_and_the_buffers() {
    let s = tiny();
    // 2 sequences of 4 tokens over tp 2: 4 tokens routed a rank, their probabilities
    // 4 x 4 x 4 bytes; 8 copies, each input 16, hidden 3 x 2 x 6 = 36 and output 16 bytes;
    // the shared expert 8 tokens x 2 x 3 x 5 / 2.
    let a = moe_activations(&s, 8, 2, 1, 1.0).unwrap();
    assert_eq!(a.stash, 64 + 8 * 68 + 120);
    assert_eq!(a.dispatch_buffers, 8 * 2 * 16);
    // Capacity 1.25 and etp 2: 10 copies, each input gathered twice over expert-TP.
    let b = moe_activations(&s, 8, 2, 2, 1.25).unwrap();
    assert_eq!(b.stash, 64 + 10 * (32 + 36 + 16) + 120);
    assert_eq!(b.dispatch_buffers, 10 * 2 * 16);
    let dense = ModelShape { moe: None, ..s };
    assert!(moe_activations(&dense, 8, 2, 1, 1.0).is_none());
}
