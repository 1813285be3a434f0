//! Finite-difference gradient checks of the kernels and layers of today's
//! model shapes (grouped-query and multi-query attention, gated MLPs, RMSNorm,
//! rotary positions),
//! input backward (I) and weight backward (W) alike, and grouped-query
//! attention against multi-head attention with its key/value heads repeated.

use crate::common;

use common::{check_input, check_params, dot, randn};
use pipewright_kernels::cpu::{self, AttnShape, GluKind};
use pipewright_kernels::layers::{
    Attention, Block, Heads, Linear, LmHead, Mlp, NoTp, Norm, RmsNorm, TpShard,
};
use pipewright_kernels::{Cpu, Tensor};
use std::sync::Arc;

#[test]
fn gated_unit_gradients() {
    for kind in [GluKind::SwiGlu, GluKind::GeGlu] {
        let h = Tensor::new(
            &[3, 8],
            randn(&[24], "h").data().iter().map(|v| 2.0 * v).collect(),
        )
        .unwrap();
        let r = randn(&[3, 4], "r");
        let dh = cpu::glu_backward(&h, &r, kind).unwrap();
        check_input(&format!("{kind:?} dh"), &h, &dh, 24, |h| {
            dot(&cpu::glu(h, kind).unwrap(), &r)
        });
    }
}

#[test]
fn rms_norm_gradients_split_into_input_and_weight() {
    let (x, r, g) = (randn(&[4, 6], "x"), randn(&[4, 6], "r"), randn(&[6], "g"));
    let (_, stash) = cpu::rms_norm(&x, &g, 1e-5).unwrap();
    let dx = cpu::rms_norm_backward_input_from(&r, &g, &stash.xhat, &stash.rstd).unwrap();
    let mut dg = Tensor::zeros(&[6]);
    cpu::rms_norm_backward_weight(&r, &stash.xhat, &mut dg).unwrap();
    let f = |x: &Tensor, g: &Tensor| dot(&cpu::rms_norm(x, g, 1e-5).unwrap().0, &r);
    check_input("rmsnorm dx", &x, &dx, 24, |x| f(x, &g));
    check_input("rmsnorm dgamma", &g, &dg, 6, |g| f(&x, g));
}

#[test]
fn grouped_and_multi_query_attention_core_gradients() {
    for kv_heads in [2, 1] {
        let sh = AttnShape {
            batch: 2,
            seq: 4,
            heads: 4,
            kv_heads,
            head_dim: 3,
        };
        let qkv = randn(&[8, sh.qkv_width()], "qkv");
        let r = randn(&[2, 4, 12], "r");
        let (_, probs) = cpu::causal_attention(&qkv, sh).unwrap();
        let d = cpu::causal_attention_backward(&qkv, &probs, &r, sh).unwrap();
        check_input(&format!("{kv_heads} kv heads: dqkv"), &qkv, &d, 200, |q| {
            dot(&cpu::causal_attention(q, sh).unwrap().0, &r)
        });
    }
}

/// `qkv` of grouped-query shape `sh` as multi-head attention's: each key/value
/// head copied to every query head of its group.
fn repeat_kv(qkv: &Tensor, sh: AttnShape) -> Tensor {
    let (w, dh, g) = (sh.width(), sh.head_dim, sh.group());
    let mut out = Vec::new();
    for row in qkv.data().chunks(sh.qkv_width()) {
        out.extend_from_slice(&row[..w]);
        for part in 0..2 {
            for h in 0..sh.heads {
                let at = w + part * sh.kv_width() + (h / g) * dh;
                out.extend_from_slice(&row[at..at + dh]);
            }
        }
    }
    Tensor::new(&[qkv.rows(), 3 * w], out).unwrap()
}

#[test]
fn grouped_query_attention_is_multi_head_with_repeated_key_value_heads() {
    let sh = AttnShape {
        batch: 2,
        seq: 5,
        heads: 6,
        kv_heads: 2,
        head_dim: 4,
    };
    let mha = AttnShape::mha(2, 5, 6, 4);
    let qkv = randn(&[10, sh.qkv_width()], "qkv");
    let (y, probs) = cpu::causal_attention(&qkv, sh).unwrap();
    let (y_mha, probs_mha) = cpu::causal_attention(&repeat_kv(&qkv, sh), mha).unwrap();
    assert_eq!(y, y_mha);
    assert_eq!(probs, probs_mha);
    // A key/value head's gradient is the sum of its query heads' (in head order).
    let dout = randn(&[2, 5, 24], "dout");
    let d = cpu::causal_attention_backward(&qkv, &probs, &dout, sh).unwrap();
    let d_mha =
        cpu::causal_attention_backward(&repeat_kv(&qkv, sh), &probs_mha, &dout, mha).unwrap();
    for (row, row_mha) in d.data().chunks(sh.qkv_width()).zip(d_mha.data().chunks(72)) {
        assert_eq!(&row[..24], &row_mha[..24], "dQ");
        for (part, at) in [(0, 24), (1, 24 + sh.kv_width())] {
            for j in 0..sh.kv_width() {
                let (kv, c) = (j / 4, j % 4);
                let sum: f32 = (3 * kv..3 * kv + 3)
                    .map(|h| row_mha[24 + part * 24 + h * 4 + c])
                    .fold(0.0, |a, v| a + v);
                assert!((row[at + j] - sum).abs() <= 1e-5 * (1.0 + sum.abs()));
            }
        }
    }
}

fn scaled(t: Tensor, k: f32) -> Tensor {
    Tensor::new(t.shape(), t.data().iter().map(|v| v * k).collect()).unwrap()
}

fn gated_mlp(d: usize, f: usize, kind: GluKind) -> Mlp {
    let (g, u) = (randn(&[d, f], "wg"), randn(&[d, f], "wu"));
    let down = scaled(randn(&[f, d], "wd"), 0.5);
    let cpu = Arc::new(Cpu);
    Mlp::gated_from_full_on(&cpu, "mlp", kind, (&g, &u), &down, TpShard::SINGLE).unwrap()
}

#[test]
fn gated_mlp_layers() {
    for kind in [GluKind::SwiGlu, GluKind::GeGlu] {
        let mut m = gated_mlp(4, 6, kind);
        let (x, r) = (randn(&[2, 3, 4], "x"), randn(&[2, 3, 4], "r"));
        let (_, s) = m.forward(x.clone(), &mut NoTp).unwrap();
        let (dx, ws) = m.backward_input(s, r.clone(), &mut NoTp).unwrap();
        m.backward_weight(ws).unwrap();
        let f = |m: &Mlp, x: &Tensor| dot(&m.forward(x.clone(), &mut NoTp).unwrap().0, &r);
        check_input(&format!("{kind:?} mlp dx"), &x, &dx, 24, |x| f(&m, x));
        // Two parameters, no biases: the fused gate/up and the down projection.
        assert_eq!(check_params(&m, 12, |m| f(m, &x)), 24);
    }
}

#[test]
fn rms_norm_layer() {
    let mut n = RmsNorm::new("n", 5);
    n.gamma.value = randn(&[5], "g");
    let (x, r) = (randn(&[3, 5], "x"), randn(&[3, 5], "r"));
    let (_, s) = n.forward(&x).unwrap();
    let dx = n.backward_input(&r, &s).unwrap();
    n.backward_weight(&r, &s).unwrap();
    check_input("rmsnorm layer dx", &x, &dx, 15, |x| {
        dot(&n.forward(x).unwrap().0, &r)
    });
    check_params(&n, 5, |m| dot(&m.forward(&x).unwrap().0, &r));
}

fn gqa(d: usize, heads: Heads, scale: f32) -> Attention {
    let q = (heads.query + 2 * heads.kv) * d / heads.query;
    let (wq, bq) = (scaled(randn(&[d, q], "wqkv"), scale), randn(&[q], "bqkv"));
    let (wo, bo) = (scaled(randn(&[d, d], "wo"), scale), randn(&[d], "bo"));
    let cpu = Arc::new(Cpu);
    let (qkv, out) = ((&wq, Some(&bq)), (&wo, Some(&bo)));
    Attention::grouped_from_full_on(&cpu, "attn", heads, qkv, out, TpShard::SINGLE).unwrap()
}

#[test]
fn grouped_query_attention_layer() {
    for kv in [2, 1] {
        let heads = Heads { query: 4, kv };
        let mut a = gqa(8, heads, 0.5);
        let (x, r) = (randn(&[2, 3, 8], "x"), randn(&[2, 3, 8], "r"));
        let (_, s) = a.forward(x.clone(), &mut NoTp).unwrap();
        let (dx, ws) = a.backward_input(s, r.clone(), &mut NoTp).unwrap();
        a.backward_weight(ws).unwrap();
        let f = |a: &Attention, x: &Tensor| dot(&a.forward(x.clone(), &mut NoTp).unwrap().0, &r);
        check_input(&format!("{kv} kv heads: layer dx"), &x, &dx, 48, |x| {
            f(&a, x)
        });
        check_params(&a, 10, |a| f(a, &x));
    }
}

/// Attention with rotary positions, I and W, with 4, 2 and 1 key/value heads: the
/// rotation's backward (the inverse rotation) is the gradient of the forward.
#[test]
fn rotary_attention_layer() {
    // Base 10: both pairs of a 4-wide head turn visibly over 3 positions.
    let table = Arc::new(cpu::rotary_table(3, 4, 10.0).unwrap());
    for kv in [4, 2, 1] {
        let heads = Heads { query: 4, kv };
        let plain = gqa(16, heads, 0.5);
        let mut a = gqa(16, heads, 0.5).with_rotary(table.clone()).unwrap();
        assert!(a.is_rotary() && !plain.is_rotary());
        let (x, r) = (randn(&[2, 3, 16], "x"), randn(&[2, 3, 16], "r"));
        let (y, s) = a.forward(x.clone(), &mut NoTp).unwrap();
        // Position 0 turns by nothing and attends only to itself: the first row of each
        // sequence is attention's without rotary positions; later rows are not.
        let (y0, _) = plain.forward(x.clone(), &mut NoTp).unwrap();
        for b in 0..2 {
            let row = |t: &Tensor, p: usize| t.data()[(b * 3 + p) * 16..][..16].to_vec();
            assert_eq!(row(&y, 0), row(&y0, 0));
            assert_ne!(row(&y, 2), row(&y0, 2));
        }
        let (dx, ws) = a.backward_input(s, r.clone(), &mut NoTp).unwrap();
        a.backward_weight(ws).unwrap();
        let f = |a: &Attention, x: &Tensor| dot(&a.forward(x.clone(), &mut NoTp).unwrap().0, &r);
        check_input(&format!("rotary, {kv} kv heads: dx"), &x, &dx, 48, |x| {
            f(&a, x)
        });
        check_params(&a, 10, |a| f(a, &x));
    }
    let odd = cpu::rotary_table(3, 2, 10.0).unwrap();
    let err = gqa(16, Heads { query: 4, kv: 2 }, 0.5).with_rotary(Arc::new(odd));
    assert!(
        err.is_err(),
        "a table for heads of width 2 on heads of width 4"
    );
}

#[test]
fn llama_shaped_block_and_head() {
    let (mut ln1, mut ln2) = (RmsNorm::new("ln1", 8), RmsNorm::new("ln2", 8));
    ln1.gamma.value = randn(&[8], "g1");
    ln2.gamma.value = randn(&[8], "g2");
    let mut b = Block {
        ln1: ln1.into(),
        attn: gqa(8, Heads { query: 4, kv: 2 }, 0.4),
        ln2: ln2.into(),
        mlp: gated_mlp(8, 12, GluKind::SwiGlu).into(),
    };
    let (x, r) = (randn(&[2, 3, 8], "x"), randn(&[2, 3, 8], "r"));
    let (_, s) = b.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = b.backward_input(s, r.clone(), &mut NoTp).unwrap();
    b.backward_weight(ws).unwrap();
    let f = |b: &Block, x: &Tensor| dot(&b.forward(x.clone(), &mut NoTp).unwrap().0, &r);
    check_input("block dx", &x, &dx, 48, |x| f(&b, x));
    check_params(&b, 6, |b| f(b, &x));

    let mut h = LmHead {
        ln_f: Norm::Rms(RmsNorm::new("ln_f", 4)),
        proj: Linear::new("proj", randn(&[4, 7], "w"), Some(randn(&[7], "b"))).unwrap(),
    };
    let x = randn(&[2, 3, 4], "x");
    let targets = [1, 6, 0, 2, 2, 5];
    let (_, s) = h.forward(&x, &targets, 0.5).unwrap();
    let (dx, ws) = h.backward_input(s).unwrap();
    h.backward_weight(ws).unwrap();
    let f = |h: &LmHead, x: &Tensor| h.forward(x, &targets, 0.5).unwrap().0 as f64;
    check_input("head dx", &x, &dx, 24, |x| f(&h, x));
    check_params(&h, 10, |h| f(h, &x));
}

/// The config's count is the built model's, for every combination of kinds.
#[test]
fn every_shape_counts_its_own_parameters() {
    use pipewright_kernels::gpt::{BiasKind, GptConfig, GptStage, MlpKind, NormKind};
    use pipewright_kernels::layers::Parameters;
    for mlp in [MlpKind::Gelu, MlpKind::SwiGlu, MlpKind::GeGlu] {
        for norm in [NormKind::LayerNorm, NormKind::RmsNorm] {
            for bias in [BiasKind::All, BiasKind::Qkv, BiasKind::None] {
                for kv_heads in [4, 2, 1] {
                    let cfg = GptConfig {
                        kv_heads,
                        d_ff: 24,
                        mlp,
                        norm,
                        bias,
                        ..GptConfig::new(16, 8, 16, 4, 2)
                    };
                    let whole = GptStage::whole(&cfg, 1).unwrap();
                    assert_eq!(whole.num_params(), cfg.num_params(), "{cfg:?}");
                }
            }
        }
    }
}
