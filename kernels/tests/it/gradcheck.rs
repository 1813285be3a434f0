//! Finite-difference gradient checks for every op and layer, including that
//! input backward (I) followed by weight backward (W) is the full gradient.

use crate::common;

use common::{check_input, check_params, dot, randn};
use pipewright_kernels::cpu::{self, AttnShape};
use pipewright_kernels::layers::{Attention, Block, LayerNorm, Linear, LmHead, Mlp, NoTp, TpShard};
use pipewright_kernels::Tensor;

#[test]
fn matmul_input_and_weight_gradients() {
    let (x, w, r) = (
        randn(&[2, 3, 4], "x"),
        randn(&[4, 5], "w"),
        randn(&[2, 3, 5], "r"),
    );
    let dx = cpu::matmul_nt(&r, &w).unwrap();
    let mut dw = Tensor::zeros(&[4, 5]);
    cpu::matmul_tn_acc(&x, &r, &mut dw).unwrap();
    check_input("matmul dx", &x, &dx, 24, |x| {
        dot(&cpu::matmul(x, &w).unwrap(), &r)
    });
    check_input("matmul dw", &w, &dw, 20, |w| {
        dot(&cpu::matmul(&x, w).unwrap(), &r)
    });
}

#[test]
fn bias_and_gelu_gradients() {
    let (x, b, r) = (randn(&[3, 4], "x"), randn(&[4], "b"), randn(&[3, 4], "r"));
    let mut db = Tensor::zeros(&[4]);
    cpu::bias_grad_acc(&r, &mut db).unwrap();
    check_input("bias db", &b, &db, 4, |b| {
        let mut y = x.clone();
        cpu::add_bias(&mut y, b).unwrap();
        dot(&y, &r)
    });
    let x3 = Tensor::new(&[3, 4], x.data().iter().map(|v| 3.0 * v).collect()).unwrap();
    let dx = cpu::gelu_backward(&x3, &r).unwrap();
    check_input("gelu dx", &x3, &dx, 12, |x| dot(&cpu::gelu(x), &r));
}

#[test]
fn layer_norm_gradients_split_into_input_and_weight() {
    let (x, r) = (randn(&[4, 6], "x"), randn(&[4, 6], "r"));
    let (g, b) = (randn(&[6], "g"), randn(&[6], "b"));
    let (_, stash) = cpu::layer_norm(&x, &g, &b, 1e-5).unwrap();
    let dx = cpu::layer_norm_backward_input(&r, &g, &stash).unwrap();
    let (mut dg, mut db) = (Tensor::zeros(&[6]), Tensor::zeros(&[6]));
    cpu::layer_norm_backward_weight(&r, &stash.xhat, &mut dg, &mut db).unwrap();
    let f =
        |x: &Tensor, g: &Tensor, b: &Tensor| dot(&cpu::layer_norm(x, g, b, 1e-5).unwrap().0, &r);
    check_input("layernorm dx", &x, &dx, 24, |x| f(x, &g, &b));
    check_input("layernorm dgamma", &g, &dg, 6, |g| f(&x, g, &b));
    check_input("layernorm dbeta", &b, &db, 6, |b| f(&x, &g, b));
}

#[test]
fn cross_entropy_gradient_with_scale() {
    let logits = randn(&[5, 7], "logits");
    let targets = [0, 6, 3, 3, 1];
    let (_, probs) = cpu::cross_entropy(&logits, &targets, 0.25).unwrap();
    let d = cpu::cross_entropy_backward(probs, &targets, 0.25).unwrap();
    check_input("cross-entropy dlogits", &logits, &d, 35, |z| {
        cpu::cross_entropy(z, &targets, 0.25).unwrap().0 as f64
    });
}

#[test]
fn embedding_weight_gradients() {
    let (wte, wpe) = (randn(&[5, 3], "wte"), randn(&[4, 3], "wpe"));
    let ids = [1, 4, 1, 0, 2, 1];
    let r = randn(&[2, 3, 3], "r");
    let (mut dwte, mut dwpe) = (Tensor::zeros(&[5, 3]), Tensor::zeros(&[4, 3]));
    cpu::embedding_backward_weight(&ids, 3, &r, &mut dwte, Some(&mut dwpe)).unwrap();
    check_input("embedding dwte", &wte, &dwte, 15, |w| {
        dot(&cpu::embedding(&ids, 3, w, Some(&wpe)).unwrap(), &r)
    });
    check_input("embedding dwpe", &wpe, &dwpe, 12, |w| {
        dot(&cpu::embedding(&ids, 3, &wte, Some(w)).unwrap(), &r)
    });
}

#[test]
fn attention_core_gradient() {
    let sh = AttnShape::mha(2, 4, 2, 3);
    let qkv = randn(&[8, 18], "qkv");
    let r = randn(&[2, 4, 6], "r");
    let (_, probs) = cpu::causal_attention(&qkv, sh).unwrap();
    let d = cpu::causal_attention_backward(&qkv, &probs, &r, sh).unwrap();
    check_input("attention dqkv", &qkv, &d, 144, |q| {
        dot(&cpu::causal_attention(q, sh).unwrap().0, &r)
    });
}

#[test]
fn attention_is_causal() {
    // Changing the last token must not change any earlier output.
    let sh = AttnShape::mha(1, 5, 2, 2);
    let qkv = randn(&[5, 12], "qkv");
    let (y, _) = cpu::causal_attention(&qkv, sh).unwrap();
    let mut q2 = qkv.clone();
    q2.data_mut()[4 * 12..].iter_mut().for_each(|v| *v += 1.0);
    let (y2, _) = cpu::causal_attention(&q2, sh).unwrap();
    assert_eq!(&y.data()[..16], &y2.data()[..16]);
    assert_ne!(&y.data()[16..], &y2.data()[16..]);
}

#[test]
fn linear_layer_i_then_w() {
    let mut l = Linear::new("l", randn(&[4, 3], "w"), Some(randn(&[3], "b"))).unwrap();
    let (x, r) = (randn(&[2, 5, 4], "x"), randn(&[2, 5, 3], "r"));
    let dx = l.backward_input(&r).unwrap();
    l.backward_weight(&x, &r).unwrap();
    check_input("linear dx", &x, &dx, 40, |x| {
        dot(&l.forward(x).unwrap(), &r)
    });
    let n = check_params(&l, 12, |l| dot(&l.forward(&x).unwrap(), &r));
    assert_eq!(n, 15);
}

#[test]
fn layer_norm_layer() {
    let mut ln = LayerNorm::new("ln", 5);
    ln.gamma.value = randn(&[5], "g");
    let (x, r) = (randn(&[3, 5], "x"), randn(&[3, 5], "r"));
    let (_, s) = ln.forward(&x).unwrap();
    let dx = ln.backward_input(&r, &s).unwrap();
    ln.backward_weight(&r, &s).unwrap();
    check_input("layernorm layer dx", &x, &dx, 15, |x| {
        dot(&ln.forward(x).unwrap().0, &r)
    });
    check_params(&ln, 5, |m| dot(&m.forward(&x).unwrap().0, &r));
}

fn mlp(d: usize, f: usize) -> Mlp {
    let (w1, b1) = (randn(&[d, f], "w1"), randn(&[f], "b1"));
    let (w2, b2) = (randn(&[f, d], "w2"), randn(&[d], "b2"));
    Mlp::from_full("mlp", &w1, &b1, &w2, &b2, TpShard::SINGLE).unwrap()
}

#[test]
fn mlp_layer() {
    let mut m = mlp(4, 8);
    let (x, r) = (randn(&[2, 3, 4], "x"), randn(&[2, 3, 4], "r"));
    let (_, s) = m.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = m.backward_input(s, r.clone(), &mut NoTp).unwrap();
    m.backward_weight(ws).unwrap();
    let f = |m: &Mlp, x: &Tensor| dot(&m.forward(x.clone(), &mut NoTp).unwrap().0, &r);
    check_input("mlp dx", &x, &dx, 24, |x| f(&m, x));
    check_params(&m, 8, |m| f(m, &x));
}

fn attention(d: usize, heads: usize, scale: f32) -> Attention {
    let s =
        |t: Tensor| Tensor::new(t.shape(), t.data().iter().map(|v| v * scale).collect()).unwrap();
    let (wq, bq) = (s(randn(&[d, 3 * d], "wqkv")), randn(&[3 * d], "bqkv"));
    let (wo, bo) = (s(randn(&[d, d], "wo")), randn(&[d], "bo"));
    Attention::from_full("attn", heads, &wq, &bq, &wo, &bo, TpShard::SINGLE).unwrap()
}

#[test]
fn attention_layer() {
    let mut a = attention(6, 2, 0.5);
    let (x, r) = (randn(&[2, 4, 6], "x"), randn(&[2, 4, 6], "r"));
    let (_, s) = a.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = a.backward_input(s, r.clone(), &mut NoTp).unwrap();
    a.backward_weight(ws).unwrap();
    let f = |a: &Attention, x: &Tensor| dot(&a.forward(x.clone(), &mut NoTp).unwrap().0, &r);
    check_input("attention layer dx", &x, &dx, 48, |x| f(&a, x));
    check_params(&a, 10, |a| f(a, &x));
}

#[test]
fn transformer_block() {
    let (mut ln1, mut ln2) = (LayerNorm::new("ln1", 6), LayerNorm::new("ln2", 6));
    ln1.gamma.value = randn(&[6], "g1");
    ln2.beta.value = randn(&[6], "b2");
    let mut b = Block {
        ln1: ln1.into(),
        attn: attention(6, 3, 0.4),
        ln2: ln2.into(),
        mlp: mlp(6, 12).into(),
    };
    let (x, r) = (randn(&[2, 3, 6], "x"), randn(&[2, 3, 6], "r"));
    let (_, s) = b.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = b.backward_input(s, r.clone(), &mut NoTp).unwrap();
    b.backward_weight(ws).unwrap();
    let f = |b: &Block, x: &Tensor| dot(&b.forward(x.clone(), &mut NoTp).unwrap().0, &r);
    check_input("block dx", &x, &dx, 36, |x| f(&b, x));
    check_params(&b, 6, |b| f(b, &x));
}

#[test]
fn lm_head_with_loss() {
    let mut h = LmHead {
        ln_f: LayerNorm::new("ln_f", 4).into(),
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
