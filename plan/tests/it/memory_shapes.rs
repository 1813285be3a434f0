//! The Megatron accounting's per-layer bytes for each kind of shape and attention, against
//! the closed forms of its module note (Korthikanti et al. 2022 generalised tensor by
//! tensor), and the plan's Llama-3-405B request of issue 26, which materialized-attention
//! memory refused all but full recomputation.

use pipewright_model::memory::{layer_activation_bytes, MemPrecision, MemoryConfig};
use pipewright_model::shape::{
    AttentionKind, BiasKind, MlpKind, ModelShape, NormKind, PositionKind,
};
use pipewright_plan::{plan, Cluster, Fixed, PlanRequest};
use pipewright_schedule::Recompute;

fn llama405() -> ModelShape {
    ModelShape {
        kv_heads: 8,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: PositionKind::Rotary,
        bias: BiasKind::None,
        ..ModelShape::gpt(126, 16384, 128, 53248, 8192, 128256)
    }
}

fn config(shape: ModelShape, tp: u32, sp: bool, attention: AttentionKind) -> MemoryConfig {
    MemoryConfig {
        tp,
        sequence_parallel: sp,
        attention,
        precision: MemPrecision::Bf16,
        ..MemoryConfig::new(shape, 1)
    }
}

fn bytes(c: &MemoryConfig, policy: Recompute) -> f64 {
    layer_activation_bytes(c, policy) as f64
}

#[test]
fn materialized_attention_keeps_korthikantis_formula() {
    let gpt = ModelShape::gpt(96, 12288, 96, 4 * 12288, 2048, 51200);
    let (s, h, a) = (2048.0, 12288.0, 96.0);
    for (t, sp) in [(1u32, false), (8, false), (8, true)] {
        let c = config(gpt, t, sp, AttentionKind::Materialized);
        let t = f64::from(t);
        let core = 5.0 * a * s * s / t;
        let want = if sp {
            34.0 * s * h / t + core
        } else {
            s * h * (10.0 + 24.0 / t) + core
        };
        assert_eq!(bytes(&c, Recompute::None), want);
        assert_eq!(bytes(&c, Recompute::Selective), want - core);
    }
}

#[test]
fn fused_attention_keeps_a_logsumexp_and_selective_drops_the_element_wise_outputs() {
    let gpt = ModelShape::gpt(96, 12288, 96, 4 * 12288, 2048, 51200);
    let (s, h, a, f) = (2048.0, 12288.0, 96.0, 4.0 * 12288.0);
    let c = config(gpt, 8, false, AttentionKind::Fused);
    // 10 sbh outside TP, 24 sbh / t inside, 4 bytes a row and head for the logsumexp.
    let none = s * h * (10.0 + 24.0 / 8.0) + 4.0 * a * s / 8.0;
    assert_eq!(bytes(&c, Recompute::None), none);
    // The norms' outputs (2 x 2sbh, replicated without SP) and GeLU's output (2 s f / t).
    assert_eq!(
        bytes(&c, Recompute::Selective),
        none - 4.0 * s * h - 2.0 * s * f / 8.0
    );
    // Nothing of s x s: doubling the sequence doubles the bytes.
    let long = config(
        ModelShape {
            seq_len: 4096,
            ..gpt
        },
        8,
        false,
        AttentionKind::Fused,
    );
    assert_eq!(bytes(&long, Recompute::None), 2.0 * none);
}

#[test]
fn gqa_and_a_gated_mlp_are_counted_tensor_by_tensor() {
    let m = llama405();
    let (s, h, a, f, kv) = (8192.0, 16384.0, 128.0, 53248.0, 1024.0);
    let c = config(m, 8, true, AttentionKind::Fused);
    // With SP everything is split by t: norms' inputs and outputs and masks 10h; Q and the
    // attention output 2h each, K and V 2kv each; gate, up and product 2f each; the
    // logsumexp 4a.
    let want = s * (10.0 * h + 4.0 * h + 4.0 * kv + 6.0 * f + 4.0 * a) / 8.0;
    assert_eq!(bytes(&c, Recompute::None), want);
    assert_eq!(
        bytes(&c, Recompute::Selective),
        want - s * (4.0 * h + 2.0 * f) / 8.0
    );
    assert_eq!(bytes(&c, Recompute::Full), 2.0 * s * h / 8.0);
}

/// Issue 26: on 16,384 H100s at tp 8, pp 16, the 405B model was refused everything but full
/// recomputation (755 GiB per GPU without, 266 GiB selective) and predicted at 33% MFU.
/// With fused attention's memory (the H100 preset's attention, now read by both models) it
/// fits without full recomputation and is faster.
#[test]
fn llama_405b_on_16k_h100s_fits_without_full_recomputation() {
    let mut req = PlanRequest::new(
        llama405(),
        Cluster::preset("h100-80g").unwrap(),
        16384,
        2048,
    );
    assert_eq!(req.attention, AttentionKind::Fused);
    req.fixed = Fixed {
        tp: Some(8),
        pp: Some(16),
        ..Fixed::default()
    };
    req.top = 3;
    let p = plan(&req, &mut |_| {}).unwrap();
    let best = &p.rows[0];
    assert_ne!(best.config.recompute, Recompute::Full, "{}", best.config);
    assert!(best.headroom_bytes >= 0);
    let mfu = best.mfu.unwrap();
    assert!(mfu > 0.36, "{mfu} {}", best.config);
    // Materialized, the same request still needs full recomputation everywhere.
    req.attention = AttentionKind::Materialized;
    let p = plan(&req, &mut |_| {}).unwrap();
    assert!(p.rows.iter().all(|r| r.config.recompute == Recompute::Full));
}
