//! Row-major matmuls through column-major cuBLAS.
//!
//! A row-major `r x c` matrix is, byte for byte, the column-major `c x r`
//! matrix of its transpose. So the row-major product `C = A B` is computed
//! as the column-major `C^T = B^T A^T`, with no copies: each call below just
//! swaps operands and picks transpose flags and leading dimensions.

use super::{cuda_err, CudaTensor};
use crate::error::{KernelError, Result};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use std::os::raw::c_int;

fn dim(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| KernelError::Cuda(format!("dimension {n} exceeds cuBLAS's int")))
}

/// cuBLAS checks its arguments before it returns early on an empty product, so a zero
/// dimension (a leading dimension of 0) would be `CUBLAS_STATUS_INVALID_VALUE`. An empty
/// product changes nothing: outputs are already zero, and `acc += 0` is `acc`.
fn empty(dims: &[c_int]) -> bool {
    dims.contains(&0)
}

/// `out = x @ w` (`x [m, k]`, `w [k, n]`): column-major `out^T = w^T x^T`.
pub(super) fn matmul(
    blas: &CudaBlas,
    x: &CudaTensor,
    w: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<()> {
    let (m, k, n) = (dim(x.rows())?, dim(x.cols())?, dim(w.cols())?);
    if empty(&[m, k, n]) {
        return Ok(()); // `out` is zero, as the caller allocated it
    }
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: n,
        n: m,
        k,
        alpha: 1.0f32,
        lda: n,
        ldb: k,
        beta: 0.0,
        ldc: n,
    };
    // SAFETY: shapes were checked by the caller; every leading dimension
    // matches the row-major layout of its buffer.
    unsafe { blas.gemm(cfg, &w.data, &x.data, &mut out.data) }.map_err(cuda_err)
}

/// `out = dy @ w^T` (`dy [m, n]`, `w [k, n]`): column-major `out^T = w dy^T`.
pub(super) fn matmul_nt(
    blas: &CudaBlas,
    dy: &CudaTensor,
    w: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<()> {
    let (m, n, k) = (dim(dy.rows())?, dim(dy.cols())?, dim(w.shape[0])?);
    if empty(&[m, n, k]) {
        return Ok(()); // `out` is zero, as the caller allocated it
    }
    let cfg = GemmConfig {
        transa: CUBLAS_OP_T,
        transb: CUBLAS_OP_N,
        m: k,
        n: m,
        k: n,
        alpha: 1.0f32,
        lda: n,
        ldb: n,
        beta: 0.0,
        ldc: k,
    };
    // SAFETY: as in `matmul`.
    unsafe { blas.gemm(cfg, &w.data, &dy.data, &mut out.data) }.map_err(cuda_err)
}

/// `acc += x^T @ dy` (`x [m, k]`, `dy [m, n]`): column-major `acc^T += dy^T x`.
pub(super) fn matmul_tn_acc(
    blas: &CudaBlas,
    x: &CudaTensor,
    dy: &CudaTensor,
    acc: &mut CudaTensor,
) -> Result<()> {
    let (m, k, n) = (dim(x.rows())?, dim(x.cols())?, dim(dy.cols())?);
    if empty(&[m, k, n]) {
        return Ok(()); // nothing to add
    }
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_T,
        m: n,
        n: k,
        k: m,
        alpha: 1.0f32,
        lda: n,
        ldb: k,
        beta: 1.0,
        ldc: n,
    };
    // SAFETY: as in `matmul`.
    unsafe { blas.gemm(cfg, &dy.data, &x.data, &mut acc.data) }.map_err(cuda_err)
}
