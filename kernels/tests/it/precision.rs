//! Reduced precision, the same on every backend: a backend in a precision computes what the
//! CPU's emulation computes (matmul inputs rounded, f32 accumulation; activations rounded to
//! bf16). On the CPU the emulation is checked against f64 products of rounded inputs; with
//! feature `cuda`, GPU 0 (cuBLAS GemmEx) against the CPU, or `skipped: <why>` without one.
//!
//! Tolerances: a product of two bf16 (or TF32) values is exact in f32, so the only error
//! left is the order of the f32 sums: at most k * 2^-24 of the sum of |terms| for k terms
//! (1e-5 of it, for k = 48 here, covers cuBLAS's blocked order with room). TF32 on a GPU may
//! truncate inputs where the CPU rounds to nearest, a difference of up to 2^-10 per input:
//! its bound is 2^-9 of the sum of |terms|.

use crate::common;

use common::randn;
use pipewright_kernels::{Backend, Cpu, Precision, PrecisionExt, Tensor};

/// `x @ w` in f64 over inputs rounded as `p` rounds them, and the sum of |terms| per output.
fn reference(p: Precision, x: &Tensor, w: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let round = |t: &Tensor| {
        let mut t = t.clone();
        p.round_matmul_input(t.data_mut());
        t
    };
    let (x, w) = (round(x), round(w));
    let (m, k, n) = (x.rows(), x.cols(), w.cols());
    let (mut out, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                let t = x.data()[i * k + l] as f64 * w.data()[l * n + j] as f64;
                out[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
        }
    }
    (out, mag)
}

fn check<B: Backend>(be: &B, p: Precision) {
    assert_eq!(be.precision(), p);
    let bound = if p == Precision::Tf32 {
        2f64.powi(-9)
    } else {
        1e-5
    };
    let x = randn(&[5, 48], "x");
    let w = randn(&[48, 7], "w");
    let got = be
        .download(
            &be.matmul(&be.upload(&x).unwrap(), &be.upload(&w).unwrap())
                .unwrap(),
        )
        .unwrap();
    let (want, mag) = reference(p, &x, &w);
    for (i, (&g, (&r, &m))) in got.data().iter().zip(want.iter().zip(&mag)).enumerate() {
        assert!(
            (g as f64 - r).abs() <= bound * m + 1e-30,
            "{p} [{i}]: {g} vs {r}"
        );
    }
    // x^T @ dy accumulates into an f32 gradient, which is not rounded.
    let dy = randn(&[5, 7], "dy");
    let mut acc = be
        .upload(&Tensor::new(&[48, 7], vec![0.5; 48 * 7]).unwrap())
        .unwrap();
    be.matmul_tn_acc(&be.upload(&x).unwrap(), &be.upload(&dy).unwrap(), &mut acc)
        .unwrap();
    let acc = be.download(&acc).unwrap();
    let mut cpu_acc = Tensor::new(&[48, 7], vec![0.5; 48 * 7]).unwrap();
    Cpu::new(p).matmul_tn_acc(&x, &dy, &mut cpu_acc).unwrap();
    let scale = 8.0 * bound;
    for (a, b) in acc.data().iter().zip(cpu_acc.data()) {
        assert!(
            (a - b).abs() as f64 <= scale * (1.0 + b.abs() as f64),
            "{p}: {a} vs {b}"
        );
    }
    // Activations: bf16 rounds to nearest even, bit for bit the same on every backend.
    let mut h = be.upload(&x).unwrap();
    be.round_activation(&mut h).unwrap();
    let mut want = x.clone();
    p.round_activation(want.data_mut());
    assert_eq!(be.download(&h).unwrap(), want, "{p}");
}

#[test]
fn cpu_emulation_is_the_product_of_rounded_inputs() {
    for p in Precision::ALL {
        check(&Cpu::new(p), p);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_computes_what_the_cpu_emulates() {
    for p in Precision::ALL {
        let Some(gpu) = pipewright_kernels::cuda::gpu_for_tests(0) else {
            return;
        };
        check(&gpu.with_precision(p), p);
    }
}
