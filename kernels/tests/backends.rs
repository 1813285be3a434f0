//! Backend-generic op tests: each check runs on the CPU and, with feature
//! `cuda`, on GPU 0 — or prints why it skipped when no GPU is usable.
//! References are naive f64 loops, so the CPU run tests the CPU ops too.

mod common;

use common::randn;
use pipewright_kernels::cpu::{self, AttnShape, GluKind};
use pipewright_kernels::{Backend, Tensor};

/// Defines `mod $name { fn cpu(); fn cuda() }` running `$check` on each backend.
macro_rules! on_every_backend {
    ($($name:ident => $check:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn cpu() {
                super::$check(&pipewright_kernels::Cpu);
            }

            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                if let Some(gpu) = pipewright_kernels::cuda::gpu_for_tests(0) {
                    super::$check(&gpu);
                }
            }
        }
    )*};
}

on_every_backend! {
    matmul_products => check_matmuls,
    empty_matmuls => check_empty_matmuls,
    bias => check_bias,
    gelu => check_gelu,
    gated_units => check_glu,
    residual_add => check_add,
    layer_norm => check_layer_norm,
    rms_norm => check_rms_norm,
    cross_entropy => check_cross_entropy,
    embedding => check_embedding,
    attention => check_attention,
    rotary => check_rotary,
}

fn assert_close(what: &str, got: &Tensor, want: &[f64], tol: f64) {
    assert_eq!(got.numel(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.data().iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn naive(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Vec<f64> {
    let at = |i: usize, p: usize| {
        if ta {
            a.data()[p * a.cols() + i]
        } else {
            a.data()[i * a.cols() + p]
        }
    };
    let bt = |p: usize, j: usize| {
        if tb {
            b.data()[j * b.cols() + p]
        } else {
            b.data()[p * b.cols() + j]
        }
    };
    let (m, k) = if ta {
        (a.cols(), a.rows())
    } else {
        (a.rows(), a.cols())
    };
    let n = if tb { b.rows() } else { b.cols() };
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| at(i, p) as f64 * bt(p, j) as f64).sum();
        }
    }
    c
}

fn check_matmuls<B: Backend>(be: &B) {
    // Odd sizes catch leading-dimension mistakes a square test would hide.
    let (x, w, dy) = (
        randn(&[2, 7, 5], "x"),
        randn(&[5, 3], "w"),
        randn(&[2, 7, 3], "dy"),
    );
    let (xd, wd, dyd) = (
        be.upload(&x).unwrap(),
        be.upload(&w).unwrap(),
        be.upload(&dy).unwrap(),
    );
    let y = be.download(&be.matmul(&xd, &wd).unwrap()).unwrap();
    assert_eq!(y.shape(), &[2, 7, 3]);
    assert_close(
        &format!("{} x@w", be.name()),
        &y,
        &naive(&x, &w, false, false),
        1e-5,
    );
    let dx = be.download(&be.matmul_nt(&dyd, &wd).unwrap()).unwrap();
    assert_eq!(dx.shape(), &[2, 7, 5]);
    assert_close(
        &format!("{} dy@w^T", be.name()),
        &dx,
        &naive(&dy, &w, false, true),
        1e-5,
    );
    let mut acc = be
        .upload(&Tensor::new(&[5, 3], vec![1.0; 15]).unwrap())
        .unwrap();
    be.matmul_tn_acc(&xd, &dyd, &mut acc).unwrap();
    let want: Vec<f64> = naive(&x, &dy, true, false)
        .iter()
        .map(|v| v + 1.0)
        .collect();
    assert_close(
        &format!("{} acc+=x^T@dy", be.name()),
        &be.download(&acc).unwrap(),
        &want,
        1e-5,
    );
    assert!(be.matmul(&wd, &wd).is_err(), "5x3 @ 5x3 must be rejected");
}

/// Products with a zero dimension: zeros of the right shape, or the accumulator unchanged
/// (cuBLAS refuses a leading dimension of 0, so the GPU must not call it for these).
fn check_empty_matmuls<B: Backend>(be: &B) {
    let up = |shape: &[usize]| be.upload(&randn(shape, "e")).unwrap();
    let down = |t: &B::Storage| be.download(t).unwrap();
    let zeros = |shape: &[usize]| Tensor::zeros(shape);
    let name = be.name();
    for (x, w, want) in [
        (&[0, 5][..], &[5, 3][..], &[0, 3][..]),
        (&[2, 0], &[0, 3], &[2, 3]),
        (&[2, 5], &[5, 0], &[2, 0]),
    ] {
        let y = down(&be.matmul(&up(x), &up(w)).unwrap());
        assert_eq!(y, zeros(want), "{name}: {x:?} @ {w:?}");
    }
    for (dy, w, want) in [
        (&[0, 3][..], &[5, 3][..], &[0, 5][..]),
        (&[2, 3], &[0, 3], &[2, 0]),
    ] {
        let dx = down(&be.matmul_nt(&up(dy), &up(w)).unwrap());
        assert_eq!(dx, zeros(want), "{name}: {dy:?} @ {w:?}^T");
    }
    let acc0 = Tensor::new(&[5, 3], vec![1.0; 15]).unwrap();
    let mut acc = be.upload(&acc0).unwrap();
    be.matmul_tn_acc(&up(&[0, 5]), &up(&[0, 3]), &mut acc)
        .unwrap();
    assert_eq!(down(&acc), acc0, "{name}: acc += (no rows)^T @ (no rows)");
}

fn check_bias<B: Backend>(be: &B) {
    let (x, b) = (randn(&[4, 6], "x"), randn(&[6], "b"));
    let mut xd = be.upload(&x).unwrap();
    be.add_bias(&mut xd, &be.upload(&b).unwrap()).unwrap();
    let want: Vec<f64> = (0..24)
        .map(|i| x.data()[i] as f64 + b.data()[i % 6] as f64)
        .collect();
    assert_close("add_bias", &be.download(&xd).unwrap(), &want, 1e-6);
    let mut acc = be.upload(&Tensor::zeros(&[6])).unwrap();
    be.bias_grad_acc(&be.upload(&x).unwrap(), &mut acc).unwrap();
    let want: Vec<f64> = (0..6)
        .map(|j| (0..4).map(|r| x.data()[r * 6 + j] as f64).sum())
        .collect();
    assert_close("bias_grad_acc", &be.download(&acc).unwrap(), &want, 1e-5);
    assert!(be
        .add_bias(&mut xd, &be.upload(&Tensor::zeros(&[5])).unwrap())
        .is_err());
    // Rows for several of the GPU's row chunks, columns off its 32-wide blocks.
    let dy = randn(&[300, 37], "bias-dy");
    let acc0 = randn(&[37], "bias-acc");
    let mut acc = be.upload(&acc0).unwrap();
    be.bias_grad_acc(&be.upload(&dy).unwrap(), &mut acc)
        .unwrap();
    let want: Vec<f64> = (0..37)
        .map(|j| {
            acc0.data()[j] as f64 + (0..300).map(|r| dy.data()[r * 37 + j] as f64).sum::<f64>()
        })
        .collect();
    assert_close(
        "bias_grad_acc [300, 37]",
        &be.download(&acc).unwrap(),
        &want,
        1e-5,
    );
}

fn gelu64(v: f64) -> f64 {
    0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
}

fn check_gelu<B: Backend>(be: &B) {
    let x = Tensor::new(
        &[3, 5],
        randn(&[15], "x").data().iter().map(|v| 3.0 * v).collect(),
    )
    .unwrap();
    let dy = randn(&[3, 5], "dy");
    let (xd, dyd) = (be.upload(&x).unwrap(), be.upload(&dy).unwrap());
    let want: Vec<f64> = x.data().iter().map(|&v| gelu64(v as f64)).collect();
    assert_close(
        "gelu",
        &be.download(&be.gelu(&xd).unwrap()).unwrap(),
        &want,
        1e-5,
    );
    // Central difference of the f64 formula as the derivative reference.
    let want: Vec<f64> = x
        .data()
        .iter()
        .zip(dy.data())
        .map(|(&v, &g)| g as f64 * (gelu64(v as f64 + 1e-6) - gelu64(v as f64 - 1e-6)) / 2e-6)
        .collect();
    let got = be.download(&be.gelu_backward(&xd, &dyd).unwrap()).unwrap();
    assert_close("gelu_backward", &got, &want, 1e-5);
}

/// A scalar activation in f64, the reference of a gated unit's.
type Act = fn(f64) -> f64;

fn silu64(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

fn check_glu<B: Backend>(be: &B) {
    // Rows of [gate | up], f = 7 (off any vector width); gates spread over the
    // activations' curved range.
    let h = randn_affine(&[2, 3, 14], "glu-h", 3.0, 0.0);
    let da = randn(&[2, 3, 7], "glu-da");
    let (hd, dad) = (be.upload(&h).unwrap(), be.upload(&da).unwrap());
    let acts = [
        (GluKind::SwiGlu, silu64 as Act),
        (GluKind::GeGlu, gelu64 as Act),
    ];
    for (kind, act) in acts {
        let what = format!("{} {kind:?}", be.name());
        let (mut want, mut want_d) = (Vec::new(), vec![0.0; h.numel()]);
        for (r, row) in h.data().chunks(14).enumerate() {
            for j in 0..7 {
                let (g, u, d) = (
                    row[j] as f64,
                    row[7 + j] as f64,
                    da.data()[r * 7 + j] as f64,
                );
                want.push(act(g) * u);
                let slope = (act(g + 1e-6) - act(g - 1e-6)) / 2e-6;
                want_d[r * 14 + j] = d * u * slope;
                want_d[r * 14 + 7 + j] = d * act(g);
            }
        }
        let got = be.download(&be.glu(&hd, kind).unwrap()).unwrap();
        assert_eq!(got.shape(), &[2, 3, 7], "{what}");
        assert_close(&format!("{what} glu"), &got, &want, 1e-5);
        let got = be
            .download(&be.glu_backward(&hd, &dad, kind).unwrap())
            .unwrap();
        assert_eq!(got.shape(), h.shape(), "{what}");
        assert_close(&format!("{what} glu_backward"), &got, &want_d, 1e-5);
        let odd = be.upload(&Tensor::zeros(&[2, 5])).unwrap();
        assert!(be.glu(&odd, kind).is_err(), "{what}: odd width");
        assert!(
            be.glu_backward(&hd, &hd, kind).is_err(),
            "{what}: wide gradient"
        );
    }
}

fn check_add<B: Backend>(be: &B) {
    let (a, b) = (randn(&[2, 3, 4], "a"), randn(&[2, 3, 4], "b"));
    let (ad, bd) = (be.upload(&a).unwrap(), be.upload(&b).unwrap());
    let want: Vec<f64> = a
        .data()
        .iter()
        .zip(b.data())
        .map(|(x, y)| *x as f64 + *y as f64)
        .collect();
    assert_close(
        "add",
        &be.download(&be.add(&ad, &bd).unwrap()).unwrap(),
        &want,
        1e-6,
    );
    assert!(be
        .add(&ad, &be.upload(&Tensor::zeros(&[24])).unwrap())
        .is_err());
}

/// The CPU op's result as the reference for a backend's.
fn f64s(t: &Tensor) -> Vec<f64> {
    t.data().iter().map(|&v| v as f64).collect()
}

/// Relative tolerance of the ops below against the CPU ops: f32 math in a
/// different order (and expf, FMA) on a GPU; exact on the CPU backend.
const TOL: f64 = 1e-4;

/// A random tensor `scale * N(0, 1) + shift`.
fn randn_affine(shape: &[usize], tag: &str, scale: f32, shift: f32) -> Tensor {
    let data = randn(shape, tag)
        .data()
        .iter()
        .map(|v| scale * v + shift)
        .collect();
    Tensor::new(shape, data).unwrap()
}

fn check_layer_norm<B: Backend>(be: &B) {
    // Widths below, at and off the kernels' float4 path (multiples of 4) and
    // beyond one pass of a 256-thread block; rows enough for several
    // row chunks of the GPU's column sums.
    for (rows, n) in [(6, 7), (5, 64), (3, 1028), (2, 1030), (300, 12)] {
        check_layer_norm_shape(be, rows, n);
    }
}

fn check_layer_norm_shape<B: Backend>(be: &B, rows: usize, n: usize) {
    let name = format!("{} [{rows}, {n}]", be.name());
    // A large mean checks that statistics keep their precision.
    let x = randn_affine(&[rows, n], "ln-x", 2.0, 5.0);
    let (gamma, beta, dy) = (
        randn(&[n], "ln-g"),
        randn(&[n], "ln-b"),
        randn(&[rows, n], "ln-dy"),
    );
    let (y, stash) = cpu::layer_norm(&x, &gamma, &beta, 1e-5).unwrap();
    let (xd, gd, bd, dyd) = (
        be.upload(&x).unwrap(),
        be.upload(&gamma).unwrap(),
        be.upload(&beta).unwrap(),
        be.upload(&dy).unwrap(),
    );
    let (yd, sd) = be.layer_norm(&xd, &gd, &bd, 1e-5).unwrap();
    let got = be.download(&yd).unwrap();
    assert_eq!(got.shape(), y.shape());
    assert_close(&format!("{name} layer_norm"), &got, &f64s(&y), TOL);

    let dx = cpu::layer_norm_backward_input(&dy, &gamma, &stash).unwrap();
    let got = be
        .download(&be.layer_norm_backward_input(&dyd, &gd, &sd).unwrap())
        .unwrap();
    assert_close(&format!("{name} layer_norm dx"), &got, &f64s(&dx), TOL);

    // Gradients accumulate into what is there.
    let (mut dg, mut db) = (randn(&[n], "ln-dg"), randn(&[n], "ln-db"));
    let (mut dgd, mut dbd) = (be.upload(&dg).unwrap(), be.upload(&db).unwrap());
    cpu::layer_norm_backward_weight(&dy, &stash.xhat, &mut dg, &mut db).unwrap();
    be.layer_norm_backward_weight(&dyd, &sd, &mut dgd, &mut dbd)
        .unwrap();
    let what = format!("{name} layer_norm dgamma");
    assert_close(&what, &be.download(&dgd).unwrap(), &f64s(&dg), TOL);
    let what = format!("{name} layer_norm dbeta");
    assert_close(&what, &be.download(&dbd).unwrap(), &f64s(&db), TOL);

    let g1 = be.upload(&Tensor::zeros(&[n + 1])).unwrap();
    assert!(be.layer_norm(&xd, &g1, &bd, 1e-5).is_err());
    assert!(be.layer_norm_backward_input(&dyd, &g1, &sd).is_err());
}

fn check_rms_norm<B: Backend>(be: &B) {
    // As LayerNorm: widths on and off the float4 path, beyond one block's pass.
    for (rows, n) in [(6, 7), (5, 64), (3, 1028), (2, 1030), (300, 12)] {
        check_rms_norm_shape(be, rows, n);
    }
}

fn check_rms_norm_shape<B: Backend>(be: &B, rows: usize, n: usize) {
    let name = format!("{} [{rows}, {n}]", be.name());
    let x = randn_affine(&[rows, n], "rms-x", 2.0, 1.0);
    let (gamma, dy) = (randn(&[n], "rms-g"), randn(&[rows, n], "rms-dy"));
    // The CPU op against f64 arithmetic; then the backend against the CPU op.
    let (y, stash) = cpu::rms_norm(&x, &gamma, 1e-5).unwrap();
    let want: Vec<f64> = x
        .data()
        .chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let r = 1.0 / (ms + 1e-5).sqrt();
            let g = gamma.data();
            row.iter()
                .zip(g)
                .map(move |(&v, &g)| v as f64 * r * g as f64)
        })
        .collect();
    assert_close(&format!("{name} cpu rms_norm"), &y, &want, 1e-5);
    let (xd, gd, dyd) = (
        be.upload(&x).unwrap(),
        be.upload(&gamma).unwrap(),
        be.upload(&dy).unwrap(),
    );
    let (yd, sd) = be.rms_norm(&xd, &gd, 1e-5).unwrap();
    let got = be.download(&yd).unwrap();
    assert_eq!(got.shape(), y.shape());
    assert_close(&format!("{name} rms_norm"), &got, &f64s(&y), TOL);

    let dx = cpu::rms_norm_backward_input_from(&dy, &gamma, &stash.xhat, &stash.rstd).unwrap();
    let got = be
        .download(&be.rms_norm_backward_input(&dyd, &gd, &sd).unwrap())
        .unwrap();
    assert_close(&format!("{name} rms_norm dx"), &got, &f64s(&dx), TOL);

    let mut dg = randn(&[n], "rms-dg");
    let mut dgd = be.upload(&dg).unwrap();
    cpu::rms_norm_backward_weight(&dy, &stash.xhat, &mut dg).unwrap();
    be.rms_norm_backward_weight(&dyd, &sd, &mut dgd).unwrap();
    let what = format!("{name} rms_norm dgamma");
    assert_close(&what, &be.download(&dgd).unwrap(), &f64s(&dg), TOL);

    let g1 = be.upload(&Tensor::zeros(&[n + 1])).unwrap();
    assert!(be.rms_norm(&xd, &g1, 1e-5).is_err());
    assert!(be.rms_norm_backward_input(&dyd, &g1, &sd).is_err());
}

fn check_cross_entropy<B: Backend>(be: &B) {
    // The model's vocabulary (a float4 path of 8 quads per thread) and
    // widths off the float4 path.
    for (rows, v) in [(3, 8192), (4, 8195), (2, 300)] {
        check_cross_entropy_shape(be, rows, v);
    }
    let name = be.name();
    let logits = randn_affine(&[2, 5, 11], "ce-z", 3.0, 0.0);
    let targets: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 11).collect();
    let (loss, probs) = cpu::cross_entropy(&logits, &targets, 0.5).unwrap();
    let zd = be.upload(&logits).unwrap();
    let (got_loss, pd) = be.cross_entropy(&zd, &targets, 0.5).unwrap();
    assert!(
        (got_loss as f64 - loss as f64).abs() <= TOL * (1.0 + loss.abs() as f64),
        "{name} cross_entropy loss: {got_loss} vs {loss}"
    );
    let what = format!("{name} cross_entropy probs");
    assert_close(&what, &be.download(&pd).unwrap(), &f64s(&probs), TOL);

    let grad = cpu::cross_entropy_backward(probs, &targets, 0.5).unwrap();
    let got = be
        .download(&be.cross_entropy_backward(pd, &targets, 0.5).unwrap())
        .unwrap();
    assert_eq!(got.shape(), grad.shape());
    let what = format!("{name} cross_entropy grad");
    assert_close(&what, &got, &f64s(&grad), TOL);

    // An empty batch: zero loss, empty probabilities, as on the CPU.
    let (zero, empty) = be
        .cross_entropy(&be.upload(&Tensor::zeros(&[0, 11])).unwrap(), &[], 1.0)
        .unwrap();
    assert_eq!(zero, 0.0, "{name}: loss of no rows");
    assert_eq!(be.download(&empty).unwrap().shape(), &[0, 11]);

    let mut bad = targets.clone();
    bad[4] = 11;
    assert!(be.cross_entropy(&zd, &bad, 1.0).is_err(), "target 11 of 11");
    assert!(be.cross_entropy(&zd, &targets[1..], 1.0).is_err());
}

fn check_cross_entropy_shape<B: Backend>(be: &B, rows: usize, v: usize) {
    let name = format!("{} [{rows}, {v}]", be.name());
    let logits = randn_affine(&[rows, v], "ce-zv", 3.0, 0.0);
    let targets: Vec<u32> = (0..rows).map(|i| ((i * 7919 + 3) % v) as u32).collect();
    let (loss, probs) = cpu::cross_entropy(&logits, &targets, 1.0).unwrap();
    let (got_loss, pd) = be
        .cross_entropy(&be.upload(&logits).unwrap(), &targets, 1.0)
        .unwrap();
    assert!(
        (got_loss as f64 - loss as f64).abs() <= TOL * (1.0 + loss.abs() as f64),
        "{name} cross_entropy loss: {got_loss} vs {loss}"
    );
    let what = format!("{name} cross_entropy probs");
    assert_close(&what, &be.download(&pd).unwrap(), &f64s(&probs), TOL);
    let grad = cpu::cross_entropy_backward(probs, &targets, 1.0).unwrap();
    let got = be
        .download(&be.cross_entropy_backward(pd, &targets, 1.0).unwrap())
        .unwrap();
    let what = format!("{name} cross_entropy grad");
    assert_close(&what, &got, &f64s(&grad), TOL);
}

fn check_embedding<B: Backend>(be: &B) {
    let name = be.name();
    let (wte, wpe) = (randn(&[13, 6], "emb-wte"), randn(&[8, 6], "emb-wpe"));
    // Three sequences of 5 with repeated tokens, so the scatter-add collides.
    let ids: Vec<u32> = (0..15u32).map(|i| (i * i + 1) % 13).collect();
    let y = cpu::embedding(&ids, 5, &wte, Some(&wpe)).unwrap();
    let (ted, ped) = (be.upload(&wte).unwrap(), be.upload(&wpe).unwrap());
    let ped = Some(&ped);
    let got = be
        .download(&be.embedding(&ids, 5, &ted, ped).unwrap())
        .unwrap();
    assert_eq!(got.shape(), &[3, 5, 6]);
    assert_close(&format!("{name} embedding"), &got, &f64s(&y), TOL);
    // Without a position table (rotary positions): the token rows themselves.
    let tokens = be
        .download(&be.embedding(&ids, 5, &ted, None).unwrap())
        .unwrap();
    for (row, &id) in tokens.data().chunks(6).zip(&ids) {
        assert_eq!(
            row,
            &wte.data()[id as usize * 6..][..6],
            "{name} tokens only"
        );
    }

    let dy = randn(&[3, 5, 6], "emb-dy");
    let (mut dwte, mut dwpe) = (randn(&[13, 6], "emb-dwte"), randn(&[8, 6], "emb-dwpe"));
    let (mut dted, mut dped) = (be.upload(&dwte).unwrap(), be.upload(&dwpe).unwrap());
    cpu::embedding_backward_weight(&ids, 5, &dy, &mut dwte, Some(&mut dwpe)).unwrap();
    let dyd = be.upload(&dy).unwrap();
    be.embedding_backward_weight(&ids, 5, &dyd, &mut dted, Some(&mut dped))
        .unwrap();
    // Every backend adds a row's gradient in the CPU's order: same bits.
    let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let what = format!("{name} embedding dwte");
    assert_eq!(bits(&be.download(&dted).unwrap()), bits(&dwte), "{what}");
    let what = format!("{name} embedding dwpe");
    assert_eq!(bits(&be.download(&dped).unwrap()), bits(&dwpe), "{what}");
    // Without a table only the token rows take the gradient (again: twice the sum).
    be.embedding_backward_weight(&ids, 5, &dyd, &mut dted, None)
        .unwrap();
    cpu::embedding_backward_weight(&ids, 5, &dy, &mut dwte, None).unwrap();
    assert_eq!(
        bits(&be.download(&dted).unwrap()),
        bits(&dwte),
        "{name} tokens only"
    );

    assert!(be.embedding(&[0, 13], 2, &ted, ped).is_err(), "id 13 of 13");
    assert!(be.embedding(&ids[1..], 5, &ted, ped).is_err());
    assert!(
        be.embedding(&[0; 9], 9, &ted, ped).is_err(),
        "9 > 8 positions"
    );
}

fn check_attention<B: Backend>(be: &B) {
    // Odd sizes, several sequences and heads: index mistakes between heads
    // or sequences show up as mismatches. Sequences off every GPU tile
    // (8, 16, 32 rows), one head, and each padded head width.
    // (batch, seq, heads, key/value heads, head_dim): multi-head, then
    // grouped-query (2 and 3 query heads a group) and multi-query.
    let shapes = [
        (2, 5, 3, 3, 4),
        (1, 37, 1, 1, 16),
        (2, 33, 2, 2, 32),
        (1, 70, 2, 2, 64),
        (1, 41, 1, 1, 128),
        (1, 19, 2, 2, 100),
        (2, 5, 4, 2, 4),
        (2, 33, 6, 2, 32),
        (1, 41, 4, 1, 128),
        (1, 70, 8, 1, 64),
    ];
    for (batch, seq, heads, kv_heads, head_dim) in shapes {
        let sh = AttnShape {
            batch,
            seq,
            heads,
            kv_heads,
            head_dim,
        };
        check_attention_shape(be, sh);
    }
}

fn check_attention_shape<B: Backend>(be: &B, sh: AttnShape) {
    let name = format!("{} {sh:?}", be.name());
    let (rows, w) = (sh.batch * sh.seq, sh.width());
    let qkv = randn(&[rows, sh.qkv_width()], "attn-qkv");
    let (out, probs) = cpu::causal_attention(&qkv, sh).unwrap();
    let qd = be.upload(&qkv).unwrap();
    let (od, stash) = be.causal_attention(&qd, sh).unwrap();
    let got_out = be.download(&od).unwrap();
    assert_eq!(got_out.shape(), &[sh.batch, sh.seq, w]);
    assert_close(&format!("{name} attention out"), &got_out, &f64s(&out), TOL);

    let dout = randn(&[sh.batch, sh.seq, w], "attn-dout");
    let dqkv = cpu::causal_attention_backward(&qkv, &probs, &dout, sh).unwrap();
    let dod = be.upload(&dout).unwrap();
    let got = be
        .download(
            &be.causal_attention_backward(&qd, &od, &stash, &dod, sh)
                .unwrap(),
        )
        .unwrap();
    assert_eq!(got.shape(), qkv.shape());
    assert_close(&format!("{name} attention dqkv"), &got, &f64s(&dqkv), TOL);

    let bad = AttnShape {
        heads: sh.heads + 1,
        ..sh
    };
    assert!(be.causal_attention(&qd, bad).is_err());
    if sh.kv_heads > 1 {
        // Key/value heads that do not divide the query heads (or widths that do not match).
        let bad = AttnShape {
            kv_heads: sh.kv_heads - 1,
            ..sh
        };
        assert!(be.causal_attention(&qd, bad).is_err());
    }
    let short = be.upload(&Tensor::zeros(&[rows, w + 1])).unwrap();
    assert!(be
        .causal_attention_backward(&qd, &od, &stash, &short, sh)
        .is_err());
}

/// The GPU kernels pad heads to at most 128 columns; wider heads are refused
/// with a message naming the limit, before any launch.
#[cfg(feature = "cuda")]
#[test]
fn cuda_attention_refuses_heads_wider_than_128() {
    let Some(gpu) = pipewright_kernels::cuda::gpu_for_tests(0) else {
        return;
    };
    let sh = AttnShape::mha(1, 2, 1, 129);
    let qkv = gpu.upload(&randn(&[2, 3 * 129], "wide")).unwrap();
    let err = gpu.causal_attention(&qkv, sh).unwrap_err().to_string();
    assert!(err.contains("head_dim above the GPU kernels' 128"), "{err}");
}

#[test]
fn upload_download_round_trip_on_cpu() {
    let t = randn(&[3, 4], "t");
    let be = pipewright_kernels::Cpu;
    assert_eq!(be.download(&be.upload(&t).unwrap()).unwrap(), t);
}

/// The bits of a host tensor (NaN-safe equality).
fn bits(t: &Tensor) -> Vec<u32> {
    t.data().iter().map(|v| v.to_bits()).collect()
}

/// A kept tensor holds its precision's activation bytes (2 an element in bf16, 4 otherwise)
/// and restores, by reference and by value, to exactly the host backend's kept values: the
/// tensor itself in f32 and tf32, its bf16 rounding (ties to even, NaN and infinities kept)
/// in bf16.
fn check_kept<B: Backend>(be: &B) {
    use pipewright_kernels::kept::HostKept;
    use pipewright_kernels::{Footprint, Shaped};
    let p = be.precision();
    let mut x = randn(&[3, 5, 7], "kept");
    // Ties (1 + 2^-8 rounds down to even, 1 + 3 * 2^-8 up), huge values and non-finite ones.
    let special = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        -0.0,
    ];
    x.data_mut()[..special.len()].copy_from_slice(&special);
    for t in [x, Tensor::zeros(&[0, 4])] {
        let want = HostKept::new(t.clone(), p).restore().unwrap().clone();
        let kept = be.keep(be.upload(&t).unwrap()).unwrap();
        let size = if p == pipewright_kernels::Precision::Bf16 {
            2
        } else {
            4
        };
        assert_eq!(kept.bytes(), t.numel() * size, "{p}: bytes");
        assert_eq!(kept.shape(), t.shape(), "{p}: shape");
        let got = be.download(&be.restore(&kept).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "{p}: restored by reference");
        let owned = be.download(&be.restore_owned(kept).unwrap()).unwrap();
        assert_eq!(bits(&owned), bits(&want), "{p}: restored by value");
    }
}

#[test]
fn kept_tensors_on_cpu() {
    for p in pipewright_kernels::Precision::ALL {
        check_kept(&pipewright_kernels::Cpu::new(p));
    }
}

/// The GPU's keep and restore against the host's, bit for bit, in every precision.
#[cfg(feature = "cuda")]
#[test]
fn kept_tensors_on_gpu() {
    for p in pipewright_kernels::Precision::ALL {
        let Some(gpu) = pipewright_kernels::cuda::gpu_for_tests(0) else {
            return;
        };
        check_kept(&gpu.with_precision(p));
    }
}

/// RoPE against its definition (Su et al. 2021, eq. 34, in the rotate-half pairing): each
/// pair `(x_i, x_{i + dh/2})` of a query or key head at position `p`, read as the complex
/// number `x_i + j x_{i + dh/2}`, times `e^{j p theta^(-2i/dh)}`, in f64; values untouched.
/// Grouped-query heads, sequences of different positions, a head width of 128; the inverse
/// (the backward) undoes it. The GPU turns every pair to the CPU's bits.
fn check_rotary<B: Backend>(be: &B) {
    use pipewright_kernels::cpu::rotary::Turn;
    let name = be.name();
    for (batch, seq, heads, kv_heads, head_dim, theta) in [
        (2, 5, 4, 2, 6, 10_000.0),
        (1, 37, 2, 1, 128, 500_000.0),
        (3, 4, 3, 3, 2, 100.0),
    ] {
        let sh = AttnShape {
            batch,
            seq,
            heads,
            kv_heads,
            head_dim,
        };
        let x = randn(&[batch * seq, sh.qkv_width()], "rope-x");
        let table = cpu::rotary_table(seq + 3, head_dim, theta).unwrap();
        let half = head_dim / 2;
        let mut want = f64s(&x);
        for (r, row) in want.chunks_mut(sh.qkv_width()).enumerate() {
            let p = (r % seq) as f64;
            for head in row[..(heads + kv_heads) * head_dim].chunks_mut(head_dim) {
                for i in 0..half {
                    let angle = p * theta.powf(-2.0 * i as f64 / head_dim as f64);
                    let (re, im) = (head[i], head[i + half]);
                    let (c, s) = (angle.cos(), angle.sin());
                    head[i] = re * c - im * s;
                    head[i + half] = re * s + im * c;
                }
            }
        }
        let what = format!("{name} rotary {sh:?}");
        let mut host = x.clone();
        cpu::rotary(&mut host, &table, sh).unwrap();
        assert_close(&what, &host, &want, 1e-5);
        let (mut dev, tdev) = (be.upload(&x).unwrap(), be.upload(&table).unwrap());
        be.rotary(&mut dev, &tdev, sh, Turn::Forward).unwrap();
        let got = be.download(&dev).unwrap();
        let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&host), "{what}: the CPU's bits");
        be.rotary(&mut dev, &tdev, sh, Turn::Inverse).unwrap();
        assert_close(
            &format!("{what} inverse"),
            &be.download(&dev).unwrap(),
            &f64s(&x),
            1e-5,
        );
        let short = be.upload(&cpu::rotary_table(seq - 1, head_dim, theta).unwrap());
        let err = be.rotary(&mut dev, &short.unwrap(), sh, Turn::Forward);
        assert!(
            err.is_err(),
            "{what}: a table of fewer positions than the sequence"
        );
    }
}
