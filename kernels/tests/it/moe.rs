//! The mixture-of-experts layer: routing checked by hand, top-k = E against a dense
//! mixture, finite-difference gradients of the input, router, experts and shared expert,
//! and the load-balancing loss's gradient on its own.

use crate::common;

use common::{check_input, check_params, dot, randn};
use pipewright_kernels::cpu::{Cpu, GluKind};
use pipewright_kernels::layers::moe::route::Routing;
use pipewright_kernels::layers::{Mlp, Moe, MoeConfig, NoTp, TpShard};
use pipewright_kernels::{KernelError, Tensor};
use std::sync::Arc;

const D: usize = 4;
const F: usize = 6;

/// A GeLU expert with biases, or a SwiGLU one without, on `x: [.., D]`.
fn expert(name: &str, gated: bool) -> Mlp {
    let w2 = randn(&[F, D], &format!("{name}.w2"));
    if gated {
        let (g, u) = (
            randn(&[D, F], &format!("{name}.g")),
            randn(&[D, F], &format!("{name}.u")),
        );
        let be = Arc::new(Cpu);
        Mlp::gated_from_full_on(&be, name, GluKind::SwiGlu, (&g, &u), &w2, TpShard::SINGLE).unwrap()
    } else {
        let (w1, b1, b2) = (
            randn(&[D, F], &format!("{name}.w1")),
            randn(&[F], &format!("{name}.b1")),
            randn(&[D], &format!("{name}.b2")),
        );
        Mlp::from_full(name, &w1, &b1, &w2, &b2, TpShard::SINGLE).unwrap()
    }
}

fn moe(experts: usize, top_k: usize, shared: bool, aux_coef: f32, gated: bool) -> Moe {
    let list = (0..experts)
        .map(|e| expert(&format!("moe.experts.{e}"), gated))
        .collect();
    let shared = shared.then(|| expert("moe.shared", gated));
    let router = randn(&[D, experts], "router");
    Moe::new("moe", &router, list, shared, MoeConfig { top_k, aux_coef }).unwrap()
}

/// The smallest gap between a token's k-th and (k+1)-th logit: finite differences of
/// step 1e-2 are valid only where no step changes which experts a token goes to.
fn margin(r: &Routing, experts: usize) -> f32 {
    let k = r.top_k();
    if k == experts {
        return f32::INFINITY;
    }
    let mut min = f32::INFINITY;
    for row in r.probs().chunks(experts) {
        let mut p = row.to_vec();
        p.sort_by(|a, b| b.total_cmp(a));
        min = min.min((p[k - 1] / p[k]).ln());
    }
    min
}

#[test]
fn routing_gates_and_aux_loss_by_hand() {
    // Token 0: exp(logits) = [3, 1, 2] / 6 -> top-2 = {0, 2}, gates 0.5/(5/6), (1/3)/(5/6).
    // Token 1: [1, 1, 2] / 4 -> expert 2, then the tie of 0 and 1 goes to 0; gates 2/3, 1/3.
    let logits = Tensor::new(
        &[2, 3],
        vec![3f32.ln(), 0.0, 2f32.ln(), 0.0, 0.0, 2f32.ln()],
    );
    let r = Routing::new(&logits.unwrap(), 2).unwrap();
    assert_eq!(r.chosen(), &[0, 2, 2, 0]);
    let want = [0.6, 0.4, 2.0 / 3.0, 1.0 / 3.0];
    for (g, w) in r.gates().iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "gates {:?}", r.gates());
    }
    assert_eq!(r.load(), vec![0.5, 0.0, 0.5]);
    // P = [(1/2 + 1/4) / 2, (1/6 + 1/4) / 2, (1/3 + 1/2) / 2]; aux = 0.1 * 3 * sum f P.
    let aux = 0.1 * 3.0 * (0.5 * 0.375 + 0.5 * 5.0 / 12.0);
    assert!((r.aux_loss(0.1) - aux).abs() < 1e-6, "{}", r.aux_loss(0.1));
    assert_eq!(r.assigned(0), vec![(0, 0), (1, 1)]);
    assert!(r.assigned(1).is_empty());
}

#[test]
fn layer_output_by_hand() {
    // One-hot tokens pick rows of the router, so the logits are the hand-checked ones.
    let ln = |v: f32| v.ln();
    let router = Tensor::new(
        &[3, 3],
        vec![ln(3.0), 0.0, ln(2.0), 0.0, 0.0, ln(2.0), 0.0, 0.0, 0.0],
    );
    let experts: Vec<Mlp> = (0..3).map(|e| expert3(&format!("e{e}"))).collect();
    let cfg = MoeConfig {
        top_k: 2,
        aux_coef: 0.1,
    };
    let m = Moe::new("moe", &router.unwrap(), experts.clone(), None, cfg).unwrap();
    let x = Tensor::new(&[2, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]).unwrap();
    let (y, stash) = m.forward(x.clone(), &mut NoTp).unwrap();
    let row = |t: usize| Tensor::new(&[1, 3], x.data()[t * 3..][..3].to_vec()).unwrap();
    let run = |e: usize, t: usize| experts[e].forward(row(t), &mut NoTp).unwrap().0;
    let mix = |a: (f32, Tensor), b: (f32, Tensor)| -> Vec<f32> {
        a.1.data()
            .iter()
            .zip(b.1.data())
            .map(|(p, q)| a.0 * p + b.0 * q)
            .collect()
    };
    let want = [
        mix((0.6, run(0, 0)), (0.4, run(2, 0))),
        mix((2.0 / 3.0, run(2, 1)), (1.0 / 3.0, run(0, 1))),
    ]
    .concat();
    let diff = y
        .data()
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-6, "{:?} vs {want:?}", y.data());
    assert!(
        (stash.aux_loss() - 0.11875).abs() < 1e-6,
        "{}",
        stash.aux_loss()
    );
}

/// A GeLU expert of width 3 (for the 3-wide hand check).
fn expert3(name: &str) -> Mlp {
    let (w1, b1) = (
        randn(&[3, 5], &format!("{name}.w1")),
        randn(&[5], &format!("{name}.b1")),
    );
    let (w2, b2) = (
        randn(&[5, 3], &format!("{name}.w2")),
        randn(&[3], &format!("{name}.b2")),
    );
    Mlp::from_full(name, &w1, &b1, &w2, &b2, TpShard::SINGLE).unwrap()
}

#[test]
fn all_experts_chosen_is_the_dense_softmax_mixture() {
    let m = moe(3, 3, true, 0.0, true);
    let x = randn(&[2, 5, D], "x");
    let (y, _) = m.forward(x.clone(), &mut NoTp).unwrap();
    let logits = m.router.forward(&x).unwrap();
    let mut want = m
        .shared
        .as_ref()
        .unwrap()
        .forward(x.clone(), &mut NoTp)
        .unwrap()
        .0;
    let outs: Vec<Tensor> = m
        .experts
        .iter()
        .map(|e| e.forward(x.clone(), &mut NoTp).unwrap().0)
        .collect();
    for t in 0..10 {
        let z = &logits.data()[t * 3..][..3];
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ez: Vec<f32> = z.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = ez.iter().sum();
        for (e, out) in outs.iter().enumerate() {
            for c in 0..D {
                want.data_mut()[t * D + c] += ez[e] / sum * out.data()[t * D + c];
            }
        }
    }
    assert!(y.max_abs_diff(&want).unwrap() < 1e-5);
}

/// `sum(y * r) + aux` and the layer's gradients of it after I then W.
fn loss_and_grads(m: &mut Moe, x: &Tensor, r: &Tensor) -> Tensor {
    let (_, stash) = m.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = m.backward_input(stash, r.clone(), &mut NoTp).unwrap();
    m.backward_weight(ws).unwrap();
    dx
}

fn loss(m: &Moe, x: &Tensor, r: &Tensor) -> f64 {
    let (y, stash) = m.forward(x.clone(), &mut NoTp).unwrap();
    dot(&y, r) + stash.aux_loss() as f64
}

fn gradcheck(gated: bool, shared: bool, r_scale: f32) {
    let mut m = moe(4, 2, shared, 0.5, gated);
    // A seed whose tokens each have a clear top-2 (margin 0.25 in the logits).
    let x = randn(&[2, 3, D], "x0");
    let mut r = randn(&[2, 3, D], "r");
    r.scale(r_scale);
    let (_, stash) = m.forward(x.clone(), &mut NoTp).unwrap();
    assert!(
        margin(stash.routing(), 4) > 0.1,
        "the test's routing is too close to a tie"
    );
    let dx = loss_and_grads(&mut m, &x, &r);
    check_input("moe dx", &x, &dx, 24, |x| loss(&m, x, &r));
    let n = check_params(&m, 8, |m| loss(m, &x, &r));
    assert!(n > 40, "{n} coordinates checked");
}

#[test]
fn gradients_of_input_router_experts_and_shared_expert() {
    gradcheck(false, true, 1.0);
    gradcheck(true, false, 1.0);
}

#[test]
fn load_balancing_loss_gradient_alone() {
    // With r = 0 the loss is the auxiliary one only: its gradient reaches the router
    // weights and the input through the router, and no expert.
    gradcheck(true, true, 0.0);
    let mut m = moe(4, 2, false, 0.5, false);
    let x = randn(&[2, 3, D], "x0");
    // Under a perfectly even load the loss's gradient is zero (every `f_e` alike).
    let (_, stash) = m.forward(x.clone(), &mut NoTp).unwrap();
    assert_ne!(stash.routing().load(), vec![0.25; 4]);
    let dx = loss_and_grads(&mut m, &x, &Tensor::zeros(&[2, 3, D]));
    let router = m
        .router
        .weight
        .grad
        .data()
        .iter()
        .map(|v| v.abs())
        .fold(0f32, f32::max);
    assert!(router > 1e-3, "router gradient {router}");
    assert!(dx.data().iter().any(|v| v.abs() > 1e-4));
    assert!(m
        .experts
        .iter()
        .all(|e| e.fc1.local.weight.grad.data().iter().all(|&v| v == 0.0)));
}

#[test]
fn top_k_outside_the_experts_is_refused() {
    for k in [0, 5] {
        let list = (0..4).map(|e| expert(&format!("e{e}"), false)).collect();
        let cfg = MoeConfig {
            top_k: k,
            aux_coef: 0.0,
        };
        let err = Moe::new("blocks.1.moe", &randn(&[D, 4], "w"), list, None, cfg).unwrap_err();
        assert!(matches!(err, KernelError::Config(_)), "{err}");
        assert!(err.to_string().contains("blocks.1.moe: top_k"), "{err}");
    }
    let list = (0..3).map(|e| expert(&format!("e{e}"), false)).collect();
    let cfg = MoeConfig {
        top_k: 1,
        aux_coef: 0.0,
    };
    let err = Moe::new("moe", &randn(&[D, 4], "w"), list, None, cfg).unwrap_err();
    assert!(
        err.to_string()
            .contains("router of 4 columns for 3 experts"),
        "{err}"
    );
}
