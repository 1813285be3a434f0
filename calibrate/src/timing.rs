//! Timing and the matmul grid shared by both calibrations (`calibrate` on the CPU,
//! `cuda` on a GPU), so neither imports the other.

use std::time::{Duration, Instant};

use pipewright_plan::efficiency::MatmulSample;

use super::CalibrateError;

/// Least time spent timing each measurement.
const SPAN: Duration = Duration::from_millis(40);

/// Repeat `f` until `SPAN` has passed (at least 3 times); the fastest run's seconds.
pub(super) fn fastest(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < SPAN {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

/// Matmul rates over the grid `dims` x `dims` with inner dimension `k`: `time(m, n, k)` runs
/// one `[m, k] x [k, n]` product (of 0.5s and 0.25s, whose every output is `k / 8`: it checks
/// that) and returns its fastest seconds.
pub(super) fn matmul_grid(
    dims: &[usize],
    k: usize,
    mut time: impl FnMut(usize, usize, usize) -> Result<f64, CalibrateError>,
) -> Result<Vec<MatmulSample>, CalibrateError> {
    let mut out = Vec::new();
    for &m in dims {
        for &n in dims {
            let secs = time(m, n, k)?;
            out.push(MatmulSample {
                m: m as f64,
                n: n as f64,
                k: k as f64,
                flops: 2.0 * (m * n * k) as f64 / secs,
            });
        }
    }
    Ok(out)
}

/// The value every output of a calibration matmul must have: `k` products of 0.5 and 0.25
/// (exact in bf16, tf32 and f32, and so is the sum under f32 accumulation).
pub(super) fn expected(k: usize) -> f32 {
    0.125 * k as f32
}
