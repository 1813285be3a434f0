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
            route_groups: None,
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
    // Selective recomputation rebuilds the activation's outputs: 2 x 6 a copy, and the
    // shared expert's 8 x 2 x 5 / 2.
    assert_eq!(a.activation_output, 8 * 12 + 40);
    // Capacity 1.25 and etp 2: 10 copies, each input gathered twice over expert-TP.
    let b = moe_activations(&s, 8, 2, 2, 1.25).unwrap();
    assert_eq!(b.stash, 64 + 10 * (32 + 36 + 16) + 120);
    assert_eq!(b.dispatch_buffers, 10 * 2 * 16);
    // Expert-TP gathers each copy twice at half the width: the products are as without it.
    assert_eq!(b.activation_output, 10 * 12 + 40);
    let dense = ModelShape { moe: None, ..s };
    assert!(moe_activations(&dense, 8, 2, 1, 1.0).is_none());
}

mod predicted {
    use super::tiny;
    use crate::memory::moe::ExpertLayout;
    use crate::memory::{predict, Accounting, MemPrecision, MemoryConfig};
    use pipewright_schedule::generate;
    use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};

    /// `tiny` on one pipeline device of tp 2 x dp 2, bf16, one microbatch of one sequence.
    fn config(ep: u32, etp: u32, capacity: f64) -> MemoryConfig {
        MemoryConfig {
            tp: 2,
            dp: 2,
            zero: 1,
            precision: MemPrecision::Bf16,
            experts: ExpertLayout { ep, etp, capacity },
            ..MemoryConfig::new(tiny(), 1)
        }
    }

    fn peak(c: &MemoryConfig) -> crate::memory::MemoryBreakdown {
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 1, None).unwrap());
        predict(c, &tt).unwrap()[0]
    }

    #[test]
    fn experts_are_sharded_by_ep_and_their_optimizer_state_over_expert_dp() {
        // Dense side of the rank (blocks 760, the vocabulary-split embedding 40, the final
        // norm 8, the split head 40); experts 576 under ep 2, 288 under ep 4.
        let dense = 760 + 40 + 8 + 40;
        let two = peak(&config(2, 1, 1.0));
        assert_eq!(two.parameters, 2 * (dense + 576));
        assert_eq!(two.gradients, 4 * (dense + 576));
        // ZeRO-1: the dense side over dp 2, the experts over expert-DP 4 / 2 = 2.
        assert_eq!(two.optimizer_state, 12 * (dense / 2 + 576 / 2));
        let four = peak(&config(4, 1, 1.0));
        assert_eq!(four.parameters, 2 * (dense + 288));
        // ep 4 leaves expert-DP 1: the experts' state is not sharded at all.
        assert_eq!(four.optimizer_state, 12 * (dense / 2 + 288));
    }

    #[test]
    fn the_capacity_factor_grows_the_dispatched_copies_and_their_buffers() {
        let (even, padded) = (peak(&config(2, 1, 1.0)), peak(&config(2, 1, 1.25)));
        // Each of the 2 MoE layers: 2 tokens a rank x top-2 = 4 copies, 5 at 1.25; a copy
        // keeps its input 2d = 16, three SwiGLU tensors 2 x 6 each = 36 and its output 16.
        assert_eq!(padded.activations - even.activations, 2 * 68);
        // One layer's send and receive buffers at a time, 2 x 2d bytes a copy.
        assert_eq!(padded.buffers - even.buffers, 32);
        assert_eq!(even.buffers, 4 * 32);
    }

    /// Selective recomputation under fused attention rebuilds the experts' activation
    /// outputs (Megatron-Core's `moe_act`) as it rebuilds a dense MLP's: the peak drops by
    /// them, and by the norms' outputs, as the time model charges their rebuild.
    #[test]
    fn fused_selective_recomputation_drops_the_experts_activation_outputs() {
        use crate::shape::AttentionKind;
        use pipewright_schedule::recompute::Recompute;
        use pipewright_schedule::RecomputePlan;
        let with = |recompute| MemoryConfig {
            attention: AttentionKind::Fused,
            recompute: RecomputePlan::uniform(recompute),
            sequence_parallel: false,
            ..config(2, 1, 1.0)
        };
        let (none, selective) = (
            peak(&with(Recompute::None)),
            peak(&with(Recompute::Selective)),
        );
        // A sequence of 4 tokens over tp 2. The 2 MoE layers: 4 copies x 2 x 6 bytes of
        // product, and the shared expert's 4 tokens x 2 x 5 / 2; the dense layer's product,
        // 4 x 2 x 12 / 2; the norms' outputs, 4 tokens x 4 x d 8 in each of the 3 layers.
        let (moe, dense, norms) = (4 * 12 + 20, 48, 4 * 4 * 8);
        let dropped = 2 * (moe + norms) + dense + norms;
        // At the peak, the last layer's backward has rebuilt its own (an MoE layer's).
        assert_eq!(
            none.activations - selective.activations,
            dropped - (moe + norms)
        );
    }

    #[test]
    fn a_layout_that_does_not_fit_is_refused_naming_the_field() {
        let e = |c: MemoryConfig| c.check().unwrap_err().to_string();
        assert_eq!(
            e(config(3, 1, 1.0)),
            "memory model: ep (3) must divide experts (4)"
        );
        assert_eq!(
            e(config(4, 2, 1.0)),
            "memory model: ep x etp (8) must divide tp x dp (4)"
        );
        assert!(e(config(2, 1, 0.5))
            .contains("capacity_factor must be a finite number at least 1 (got 0.5)"));
        assert!(e(config(2, 1, f64::NAN)).contains("capacity_factor"));
        let dense = MemoryConfig {
            shape: crate::shape::ModelShape::gpt(2, 8, 2, 12, 4, 10),
            ..config(2, 1, 1.0)
        };
        assert!(e(dense).contains("ep above 1 needs a mixture of experts"));
        // The reference GPT has a mixture, routed dropless, and no ZeRO-1 beside EP.
        let reference = |c: MemoryConfig| e(c.with_accounting(Accounting::Pipewright));
        assert!(config(1, 1, 1.0)
            .with_accounting(Accounting::Pipewright)
            .check()
            .is_ok());
        assert!(reference(config(1, 1, 1.25)).contains("which has no capacity factor"));
        let zero = MemoryConfig {
            zero: 1,
            ..config(2, 1, 1.0)
        };
        assert!(reference(zero).contains("which has no ZeRO-1 with expert parallelism"));
        let sp = MemoryConfig {
            zero: 0,
            sequence_parallel: true,
            ..config(1, 1, 1.0)
        };
        assert!(
            reference(sp).contains("which has no mixture of experts under sequence parallelism")
        );
    }
}
