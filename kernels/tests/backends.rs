//! Backend-generic op tests: each check runs on the CPU and, with feature
//! `cuda`, on GPU 0 — or prints why it skipped when no GPU is usable.
//! References are naive f64 loops, so the CPU run tests the CPU ops too.

mod common;

use common::randn;
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
                match pipewright_kernels::cuda::CudaBackend::new(0) {
                    Ok(gpu) => super::$check(&gpu),
                    Err(e) => eprintln!("skipping CUDA test {}: {e}", stringify!($name)),
                }
            }
        }
    )*};
}

on_every_backend! {
    matmul_products => check_matmuls,
    bias => check_bias,
    gelu => check_gelu,
    residual_add => check_add,
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

#[test]
fn upload_download_round_trip_on_cpu() {
    let t = randn(&[3, 4], "t");
    let be = pipewright_kernels::Cpu;
    assert_eq!(be.download(&be.upload(&t).unwrap()).unwrap(), t);
}
