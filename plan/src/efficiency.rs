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
    /// Whether runs on this software stack fuse attention (FlashAttention: the `s x s` scores
    /// never reach HBM) unless told otherwise: the default of a plan's
    /// [`super::PlanRequest::attention`], which the time and memory models both read. When
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

/// One measured matmul: its dimensions and the FLOP/s it ran at.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatmulSample {
    /// Rows of the left operand.
    pub m: f64,
    /// Columns of the right operand.
    pub n: f64,
    /// The shared dimension.
    pub k: f64,
    /// Measured FLOP/s (`2mnk` over the time).
    pub flops: f64,
}

/// Fit the curve to measured matmuls: the `half_dim` (searched on a log grid from 1 to 8192)
/// and peak FLOP/s that minimise the squared error of the log rates (for each `half_dim` the
/// best peak is closed-form). Returns `(peak FLOP/s, half_dim)`: the peak is what a very large
/// matmul would reach, so a calibrated cluster has `peak_fraction` 1. `None` without
/// samples or with a non-positive rate.
pub fn fit(samples: &[MatmulSample]) -> Option<(f64, f64)> {
    if samples.is_empty() || samples.iter().any(|s| s.flops.is_nan() || s.flops <= 0.0) {
        return None;
    }
    let shape = |s: &MatmulSample, d: f64| {
        [s.m, s.n, s.k]
            .iter()
            .map(|x| (x / (x + d)).ln())
            .sum::<f64>()
    };
    let n = samples.len() as f64;
    (0..=260)
        .map(|i| 2f64.powf(f64::from(i) / 20.0))
        .map(|d| {
            let log_peak = samples
                .iter()
                .map(|s| s.flops.ln() - shape(s, d))
                .sum::<f64>()
                / n;
            let err: f64 = samples
                .iter()
                .map(|s| (s.flops.ln() - log_peak - shape(s, d)).powi(2))
                .sum();
            (err, log_peak.exp(), d)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, peak, d)| (peak, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_known_curve() {
        let truth = Efficiency {
            peak_fraction: 1.0,
            half_dim: 48.0,
            fused_attention: false,
        };
        let dims = [16.0, 64.0, 256.0, 1024.0];
        let samples: Vec<MatmulSample> = dims
            .iter()
            .flat_map(|&m| dims.iter().map(move |&n| (m, n)))
            .map(|(m, n)| MatmulSample {
                m,
                n,
                k: 512.0,
                flops: 1e11 * truth.of(m, n, 512.0),
            })
            .collect();
        let (peak, d) = fit(&samples).unwrap();
        assert!((peak / 1e11 - 1.0).abs() < 0.05, "{peak}");
        assert!((d / 48.0 - 1.0).abs() < 0.05, "{d}");
        assert_eq!(fit(&[]), None);
    }

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
