//! Matrix multiply on strided views, through `matrixmultiply::sgemm`.
//!
//! Transposes never copy: a transposed operand is the same slice with its row
//! and column strides swapped ([`MatRef::t`]), which sgemm packs for free.
//! Every call is timed into a process-wide counter ([`matmul_stats`]) so a
//! benchmark can report the fraction of a training step spent in matmul; the
//! two clock reads cost tens of nanoseconds against microseconds of work.

/// The sgemm crate itself, so benchmarks can call it on the very buffers the
/// [`Tensor`] API uses and compare.
pub use matrixmultiply;

use crate::error::{shape_err, Result};
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A read-only strided matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// A mutable matrix view with unit column stride and row stride `rs >= cols`
/// (so no two elements alias).
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    rs: usize,
}

/// Panics unless the last element of a strided view lies inside `len`.
fn check_bounds(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows > 0 && cols > 0 {
        let last = (rows - 1) * rs + (cols - 1) * cs;
        assert!(
            last < len,
            "matrix view {rows}x{cols} (strides {rs},{cs}) overruns a slice of {len}"
        );
    }
}

impl<'a> MatRef<'a> {
    /// A row-major `rows` x `cols` matrix. Panics if `data` is too short.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols, 1)
    }

    /// A general strided view. Panics if it would read past `data`.
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        check_bounds(data.len(), rows, cols, rs, cs);
        Self {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// The transpose, as a view of the same memory.
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

impl<'a> MatMut<'a> {
    /// A row-major `rows` x `cols` matrix. Panics if `data` is too short.
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// Rows `rs` elements apart (a column block of a wider matrix). Panics if
    /// `rs < cols` or the view would write past `data`.
    pub fn strided(data: &'a mut [f32], rows: usize, cols: usize, rs: usize) -> Self {
        assert!(
            rs >= cols || rows <= 1,
            "row stride {rs} < cols {cols} aliases"
        );
        check_bounds(data.len(), rows, cols, rs, 1);
        Self {
            data,
            rows,
            cols,
            rs,
        }
    }
}

static CALLS: AtomicU64 = AtomicU64::new(0);
static FLOPS: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// Totals of every [`gemm`] call in this process since the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MatmulStats {
    /// Number of calls.
    pub calls: u64,
    /// Floating-point operations (2 m k n per call).
    pub flops: u64,
    /// Wall time inside sgemm, summed over threads.
    pub seconds: f64,
}

/// Reads the process-wide matmul counters.
pub fn matmul_stats() -> MatmulStats {
    MatmulStats {
        calls: CALLS.load(Ordering::Relaxed),
        flops: FLOPS.load(Ordering::Relaxed),
        seconds: NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
    }
}

/// Zeroes the process-wide matmul counters.
pub fn reset_matmul_stats() {
    CALLS.store(0, Ordering::Relaxed);
    FLOPS.store(0, Ordering::Relaxed);
    NANOS.store(0, Ordering::Relaxed);
}

/// `C = alpha * A B + beta * C`. With `beta == 0` the old contents of C are
/// ignored (not even read), as sgemm documents.
///
/// Panics if the inner or outer dimensions disagree: callers validate user
/// shapes first, so a mismatch here is a bug in this crate.
pub fn gemm(alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32, c: MatMut<'_>) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "gemm inner dimensions {m}x{k} * {}x{n}", b.rows);
    assert_eq!((c.rows, c.cols), (m, n), "gemm output shape");
    if m == 0 || n == 0 {
        return;
    }
    let start = Instant::now();
    // SAFETY: the constructors checked that every element reachable through
    // the strides lies inside its slice, C's strides do not alias, and C is
    // borrowed mutably so it cannot overlap A or B.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.data.as_mut_ptr(),
            c.rs as isize,
            1,
        );
    }
    NANOS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    CALLS.fetch_add(1, Ordering::Relaxed);
    FLOPS.fetch_add(2 * (m * k * n) as u64, Ordering::Relaxed);
}

/// `x @ w`: `x` is `[.., k]` (leading dims folded into rows), `w` is `[k, n]`;
/// the result is `[.., n]`.
pub fn matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let mut shape = x.shape().to_vec();
    match (shape.last_mut(), w.shape()) {
        (Some(last), [_, n]) => *last = *n,
        _ => {
            return Err(shape_err(
                "matmul",
                format!("{:?} @ {:?}", x.shape(), w.shape()),
            ))
        }
    }
    let numel = shape.iter().product();
    let mut out = Tensor::from_parts(shape, vec![0.0; numel]);
    matmul_into(x, w, &mut out)?;
    Ok(out)
}

/// `out = x @ w` into an existing tensor of the result's shape, so a caller
/// that reuses buffers pays no allocation (the old contents are ignored).
pub fn matmul_into(x: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
    let bad = w.shape().len() != 2
        || x.cols() != w.shape()[0]
        || out.shape().split_last().map(|(n, lead)| (*n, lead))
            != x.shape().split_last().map(|(_, lead)| (w.cols(), lead));
    if bad {
        return Err(shape_err(
            "matmul",
            format!("{:?} @ {:?} into {:?}", x.shape(), w.shape(), out.shape()),
        ));
    }
    let (m, k, n) = (x.rows(), x.cols(), w.cols());
    gemm(
        1.0,
        MatRef::new(x.data(), m, k),
        MatRef::new(w.data(), k, n),
        0.0,
        MatMut::new(out.data_mut(), m, n),
    );
    Ok(())
}

/// `dy @ w^T`: `dy` is `[.., n]`, `w` is `[k, n]`; the result is `[.., k]`.
/// This is the input gradient of `x @ w`.
pub fn matmul_nt(dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    if w.shape().len() != 2 || dy.cols() != w.cols() {
        return Err(shape_err(
            "matmul_nt",
            format!("{:?} @ {:?}^T", dy.shape(), w.shape()),
        ));
    }
    let (m, n, k) = (dy.rows(), dy.cols(), w.shape()[0]);
    let mut out = vec![0.0; m * k];
    gemm(
        1.0,
        MatRef::new(dy.data(), m, n),
        MatRef::new(w.data(), k, n).t(),
        0.0,
        MatMut::new(&mut out, m, k),
    );
    let mut shape = dy.shape().to_vec();
    *shape.last_mut().expect("cols() > 0 implies a dim") = k;
    Ok(Tensor::from_parts(shape, out))
}

/// `acc += x^T @ dy`: `x` is `[.., k]`, `dy` is `[.., n]` with the same rows,
/// `acc` is `[k, n]`. This accumulates the weight gradient of `x @ w`.
pub fn matmul_tn_acc(x: &Tensor, dy: &Tensor, acc: &mut Tensor) -> Result<()> {
    let (k, n) = (x.cols(), dy.cols());
    if x.rows() != dy.rows() || acc.shape() != [k, n] {
        return Err(shape_err(
            "matmul_tn_acc",
            format!(
                "{:?}^T @ {:?} into {:?}",
                x.shape(),
                dy.shape(),
                acc.shape()
            ),
        ));
    }
    let m = x.rows();
    gemm(
        1.0,
        MatRef::new(x.data(), m, k).t(),
        MatRef::new(dy.data(), m, n),
        1.0,
        MatMut::new(acc.data_mut(), k, n),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn seq(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * s).collect()
    }

    #[test]
    fn three_products_agree_with_naive() {
        let (m, k, n) = (5, 4, 3);
        let x = Tensor::new(&[m, k], seq(m * k, 0.3)).unwrap();
        let w = Tensor::new(&[k, n], seq(k * n, 0.2)).unwrap();
        let y = matmul(&x, &w).unwrap();
        let want = naive(x.data(), w.data(), m, k, n);
        assert!(y
            .data()
            .iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() < 1e-5));

        // dy @ w^T against naive with an explicit transpose.
        let dy = Tensor::new(&[m, n], seq(m * n, 0.1)).unwrap();
        let wt: Vec<f32> = (0..n * k).map(|i| w.data()[(i % k) * n + i / k]).collect();
        let dx = matmul_nt(&dy, &w).unwrap();
        let want = naive(dy.data(), &wt, m, n, k);
        assert!(dx
            .data()
            .iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() < 1e-5));

        // acc += x^T dy, twice: accumulation, not overwrite.
        let xt: Vec<f32> = (0..k * m).map(|i| x.data()[(i % m) * k + i / m]).collect();
        let mut acc = Tensor::zeros(&[k, n]);
        matmul_tn_acc(&x, &dy, &mut acc).unwrap();
        matmul_tn_acc(&x, &dy, &mut acc).unwrap();
        let want = naive(&xt, dy.data(), k, m, n);
        assert!(acc
            .data()
            .iter()
            .zip(&want)
            .all(|(a, b)| (a - 2.0 * b).abs() < 1e-5));
    }

    #[test]
    fn shape_errors_are_reported() {
        let x = Tensor::zeros(&[2, 3]);
        assert!(matmul(&x, &Tensor::zeros(&[4, 2])).is_err());
        assert!(matmul_nt(&x, &Tensor::zeros(&[4, 2])).is_err());
        assert!(matmul_tn_acc(&x, &Tensor::zeros(&[3, 2]), &mut Tensor::zeros(&[3, 2])).is_err());
    }

    #[test]
    fn leading_dims_fold_into_rows() {
        let x = Tensor::new(&[2, 2, 3], seq(12, 0.5)).unwrap();
        let w = Tensor::new(&[3, 4], seq(12, 0.25)).unwrap();
        let y = matmul(&x, &w).unwrap();
        assert_eq!(y.shape(), &[2, 2, 4]);
    }

    #[test]
    #[should_panic(expected = "overruns")]
    fn views_are_bounds_checked() {
        let d = [0.0; 5];
        let _ = MatRef::new(&d, 2, 3);
    }
}
