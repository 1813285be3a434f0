//! How fast one GPU runs a layer's work: matmuls at a fraction of peak that depends on their
//! shape, element-wise work at HBM bandwidth.
//!
//! A matmul `(m x k) @ (k x n)` runs at
//! `peak * peak_fraction * m/(m+d) * n/(n+d) * k/(k+d)`, `d = half_dim`: large matmuls
//! approach `peak_fraction` of peak (cuBLAS on A100 and H100 reaches 75-85% on large bf16
//! GEMMs), and a dimension of `d` halves the rate (a thin matmul cannot fill the tensor cores
//! or hide its loads). This is why a high TP degree, which thins every matmul by `tp`, and a
//! small head dimension, which thins attention's batched matmuls, cost more than their FLOPs.
//!
//! Element-wise work (layer norms, GeLU, dropout, residual adds, the softmax of unfused
//! attention) moves bytes and does no matmul, so it is charged bytes over HBM bandwidth
//! (see [`super::work`] for which bytes).
//!
//! The presets' `peak_fraction` and `half_dim` were calibrated once, by hand, against one
//! published run each (BENCHMARKS.md says which, and which rows are held out as checks).

use serde::{Deserialize, Serialize};

use super::PlanError;

/// The efficiency curve of one GPU type (and its software stack).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of peak a very large matmul reaches, in (0, 1].
    pub peak_fraction: f64,
    /// The matmul dimension at which that dimension alone halves the rate.
    pub half_dim: f64,
    /// Whether attention is fused (FlashAttention: the `s x s` scores never reach HBM). When
    /// false, mask, softmax and dropout read and write the scores (Megatron-LM of 2021).
    #[serde(default)]
    pub fused_attention: bool,
}

impl Default for Efficiency {
    fn default() -> Self {
        Efficiency::a100()
    }
}

impl Efficiency {
    /// A100 with Megatron-LM of SC'21 (unfused attention). `half_dim` 64 was chosen a
    /// priori (a 64-wide matmul fills half an A100's tensor-core tile pipeline); `peak_fraction`
    /// was calibrated once, to 0.70, on one published run (Narayanan et al. SC'21, Table 1,
    /// the 529.6B model on 2520 GPUs: 163 TFLOP/s per GPU). Every other row of BENCHMARKS.md's
    /// table is held out.
    pub fn a100() -> Self {
        Efficiency {
            peak_fraction: 0.70,
            half_dim: 64.0,
            fused_attention: false,
        }
    }

    /// H100 with Megatron-Core of 2023-24 (fused attention). Not calibrated: the A100's
    /// figures carried over (cuBLAS reaches a similar fraction of a larger peak on large bf16
    /// matmuls); BENCHMARKS.md compares it with Megatron-LM's published H100 runs.
    pub fn h100() -> Self {
        Efficiency {
            peak_fraction: 0.70,
            half_dim: 64.0,
            fused_attention: true,
        }
    }

    /// Fraction of peak of an `(m x k) @ (k x n)` matmul.
    pub fn of(&self, m: f64, n: f64, k: f64) -> f64 {
        let d = self.half_dim;
        let f = |x: f64| x / (x + d);
        self.peak_fraction * f(m) * f(n) * f(k)
    }

    /// Seconds for `flops` of `(m x k) @ (k x n)` matmuls at `peak` FLOP/s.
    pub fn matmul_time(&self, flops: f64, (m, n, k): (f64, f64, f64), peak: f64) -> f64 {
        flops / (peak * self.of(m, n, k))
    }

    /// Values in range.
    pub fn check(&self) -> Result<(), PlanError> {
        if !(self.peak_fraction > 0.0 && self.peak_fraction <= 1.0) {
            return Err(PlanError::ClusterFigure {
                what: "efficiency.peak_fraction (in (0, 1])",
                value: self.peak_fraction,
            });
        }
        if !(self.half_dim.is_finite() && self.half_dim >= 0.0) {
            return Err(PlanError::ClusterFigure {
                what: "efficiency.half_dim",
                value: self.half_dim,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dimension_of_half_dim_halves_the_rate() {
        let e = Efficiency {
            peak_fraction: 0.8,
            half_dim: 64.0,
            fused_attention: false,
        };
        let big = 1e12;
        assert!((e.of(big, big, big) - 0.8).abs() < 1e-9);
        assert!((e.of(64.0, big, big) - 0.4).abs() < 1e-9);
        assert!(e.of(128.0, 4096.0, 4096.0) < e.of(4096.0, 4096.0, 4096.0));
    }
}
