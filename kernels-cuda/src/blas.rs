//! Row-major matmuls through column-major cuBLAS.
//!
//! A row-major `r x c` matrix is, byte for byte, the column-major `c x r`
//! matrix of its transpose. So the row-major product `C = A B` is computed
//! as the column-major `C^T = B^T A^T`, with no copies: each call below just
//! swaps operands and picks transpose flags and leading dimensions.
//!
//! Each product reads its operands as [`Reads`] says: the f32 tensors themselves (plain
//! SGEMM, or TF32 tensor-core math), or bf16 copies of them; the output and the accumulation
//! are f32 in every case. In every call below cuBLAS's `A` is the second tensor argument and
//! `B` the first.

use super::{cuda_err, CudaTensor};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
use cudarc::cublas::{result as blas_result, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use pipewright_kernels_core::error::{KernelError, Result};
use std::os::raw::{c_int, c_void};

/// What a product reads: `F32` is cuBLAS's SGEMM (bit-identical to the backend before
/// precisions existed); `Tf32` the same f32 buffers with TF32 tensor-core math; `Bf16` bf16
/// copies of the call's two tensors, in argument order.
pub(super) enum Reads<'a> {
    F32,
    Tf32,
    Bf16(&'a CudaSlice<bf16>, &'a CudaSlice<bf16>),
}

/// `c = alpha * op(A) op(B) + beta * c` with `A` the second tensor and `B` the first, read
/// as `reads` says, accumulated and written in f32.
fn gemm(
    blas: &CudaBlas,
    stream: &CudaStream,
    cfg: GemmConfig<f32>,
    (first, second): (&CudaTensor, &CudaTensor),
    reads: &Reads<'_>,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let (a_ty, b_ty, compute, a, b) = match reads {
        // SAFETY (all three): the caller checked the shapes against `cfg`.
        Reads::F32 => {
            return unsafe { blas.gemm(cfg, &second.data, &first.data, c) }.map_err(cuda_err)
        }
        Reads::Tf32 => {
            let (a, _ra) = second.data.device_ptr(stream);
            let (b, _rb) = first.data.device_ptr(stream);
            let f32_ty = cudaDataType_t::CUDA_R_32F;
            let math = cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32;
            return unsafe { gemm_ex(blas, stream, &cfg, (a, f32_ty), (b, f32_ty), math, c) };
        }
        Reads::Bf16(first16, second16) => (
            cudaDataType_t::CUDA_R_16BF,
            cudaDataType_t::CUDA_R_16BF,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            *second16,
            *first16,
        ),
    };
    let (a, _ra) = a.device_ptr(stream);
    let (b, _rb) = b.device_ptr(stream);
    // SAFETY: the bf16 copies have the f32 tensors' element counts, so `cfg` fits them.
    unsafe { gemm_ex(blas, stream, &cfg, (a, a_ty), (b, b_ty), compute, c) }
}

/// `cublasGemmEx` with f32 `alpha`, `beta` and output, on device pointers the caller keeps
/// alive and ordered on `stream`.
///
/// # Safety
/// `a` and `b` must point to matrices of the types given that fit `cfg`.
unsafe fn gemm_ex(
    blas: &CudaBlas,
    stream: &CudaStream,
    cfg: &GemmConfig<f32>,
    (a, a_ty): (u64, cudaDataType_t),
    (b, b_ty): (u64, cudaDataType_t),
    compute: cublasComputeType_t,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let (c, _rc) = c.device_ptr_mut(stream);
    blas_result::gemm_ex(
        *blas.handle(),
        cfg.transa,
        cfg.transb,
        cfg.m,
        cfg.n,
        cfg.k,
        (&cfg.alpha) as *const f32 as *const c_void,
        a as *const c_void,
        a_ty,
        cfg.lda,
        b as *const c_void,
        b_ty,
        cfg.ldb,
        (&cfg.beta) as *const f32 as *const c_void,
        c as *mut c_void,
        cudaDataType_t::CUDA_R_32F,
        cfg.ldc,
        compute,
        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    )
    .map_err(cuda_err)
}

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
    stream: &CudaStream,
    (x, w): (&CudaTensor, &CudaTensor),
    reads: &Reads<'_>,
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
    // Shapes were checked by the caller; every leading dimension matches the row-major
    // layout of its buffer.
    gemm(blas, stream, cfg, (x, w), reads, &mut out.data)
}

/// `out = dy @ w^T` (`dy [m, n]`, `w [k, n]`): column-major `out^T = w dy^T`.
pub(super) fn matmul_nt(
    blas: &CudaBlas,
    stream: &CudaStream,
    (dy, w): (&CudaTensor, &CudaTensor),
    reads: &Reads<'_>,
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
    gemm(blas, stream, cfg, (dy, w), reads, &mut out.data)
}

/// `acc += x^T @ dy` (`x [m, k]`, `dy [m, n]`): column-major `acc^T += dy^T x`.
pub(super) fn matmul_tn_acc(
    blas: &CudaBlas,
    stream: &CudaStream,
    (x, dy): (&CudaTensor, &CudaTensor),
    reads: &Reads<'_>,
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
    gemm(blas, stream, cfg, (x, dy), reads, &mut acc.data)
}
