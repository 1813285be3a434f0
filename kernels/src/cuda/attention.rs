//! Causal multi-head attention core on the GPU: cuBLAS strided-batched GEMMs
//! for the products (batched over the heads of one sequence) and the NVRTC
//! causal softmax and softmax backward of `rowops.rs` in between.
//!
//! Layouts are the CPU op's (`cpu::attention`): `qkv` is
//! `[batch * seq, 3 * w]` with `w = heads * head_dim`, each row
//! `[Q_0 .. Q_{h-1} | K_0 .. | V_0 ..]`; the output `[batch, seq, w]`; the
//! probabilities `[batch, heads, seq, seq]`. Head `h` of sequence `b` is a
//! strided view (row stride `3w`, or `w` for the output) at column `h * dh`,
//! so consecutive heads are `dh` floats apart and one strided-batched GEMM
//! covers all heads of a sequence; sequences differ in stride, so they loop.
//!
//! As in `blas.rs`, a row-major `r x c` matrix with row stride `ld` is the
//! column-major `c x r` matrix of its transpose with leading dimension
//! `ld`, so each row-major product `C = op(X) op(Y)` runs as the
//! column-major `C^T = op(Y)^T op(X)^T`: `a` below is always the right-hand
//! row-major factor and `b` the left-hand one.

use super::rowops::RowKernels;
use super::{cuda_err, CudaTensor};
use crate::cpu::AttnShape;
use crate::error::{KernelError, Result};
use cudarc::cublas::sys::cublasOperation_t::{self, CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut};
use std::os::raw::{c_int, c_longlong};
use std::sync::Arc;

fn dim(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| KernelError::Cuda(format!("dimension {n} exceeds cuBLAS's int")))
}

fn stride(n: usize) -> Result<c_longlong> {
    c_longlong::try_from(n).map_err(|_| KernelError::Cuda(format!("stride {n} exceeds cuBLAS's")))
}

/// One column-major strided-batched GEMM, `C_i = alpha op(A_i) op(B_i)` for
/// `i < batch`, with `A_i = a + i * sa` (and so on), overwriting `C_i`.
pub(super) struct Batched {
    ta: cublasOperation_t,
    tb: cublasOperation_t,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    lda: usize,
    ldb: usize,
    ldc: usize,
    sa: usize,
    sb: usize,
    sc: usize,
    batch: usize,
}

/// What the attention passes need from a device: the GEMMs, on buffers
/// given with an element offset, and the two softmax kernels. The GPU runs
/// them through cuBLAS and NVRTC; the tests below emulate them on the host,
/// so the GEMM plans (the error-prone part) are checked without a GPU.
pub(super) trait Exec {
    /// A device buffer of f32.
    type Buf;
    /// `g` with `A`, `B`, `C` starting `a.1`, `b.1`, `c.1` elements in.
    fn gemm(
        &mut self,
        g: &Batched,
        a: (&Self::Buf, usize),
        b: (&Self::Buf, usize),
        c: (&mut Self::Buf, usize),
    ) -> Result<()>;
    /// Causal softmax in place over rows of `t x t` blocks.
    fn causal_softmax(&mut self, probs: &mut Self::Buf, t: usize) -> Result<()>;
    /// `ds = p * (ds - rowsum(p * ds))` in place, rows of `t`.
    fn softmax_backward(&mut self, ds: &mut Self::Buf, probs: &Self::Buf, t: usize) -> Result<()>;
}

/// The GPU: cuBLAS for the GEMMs, NVRTC kernels for the softmaxes.
pub(super) struct Gpu<'a> {
    pub(super) blas: &'a CudaBlas,
    pub(super) rows: &'a RowKernels,
    pub(super) stream: &'a Arc<CudaStream>,
}

impl Exec for Gpu<'_> {
    type Buf = CudaTensor;

    fn gemm(
        &mut self,
        g: &Batched,
        a: (&CudaTensor, usize),
        b: (&CudaTensor, usize),
        c: (&mut CudaTensor, usize),
    ) -> Result<()> {
        g.run(
            self.blas,
            &a.0.data.slice(a.1..),
            &b.0.data.slice(b.1..),
            &mut c.0.data.slice_mut(c.1..),
        )
    }

    fn causal_softmax(&mut self, probs: &mut CudaTensor, t: usize) -> Result<()> {
        self.rows.causal_softmax(self.stream, probs, t)
    }

    fn softmax_backward(
        &mut self,
        ds: &mut CudaTensor,
        probs: &CudaTensor,
        t: usize,
    ) -> Result<()> {
        self.rows.softmax_backward(self.stream, ds, probs, t)
    }
}

impl Batched {
    fn run(
        &self,
        blas: &CudaBlas,
        a: &CudaView<'_, f32>,
        b: &CudaView<'_, f32>,
        c: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: self.ta,
                transb: self.tb,
                m: dim(self.m)?,
                n: dim(self.n)?,
                k: dim(self.k)?,
                alpha: self.alpha,
                // cuBLAS wants leading dimensions of at least 1 even when
                // a dimension is 0 and nothing is read.
                lda: dim(self.lda.max(1))?,
                ldb: dim(self.ldb.max(1))?,
                beta: 0.0,
                ldc: dim(self.ldc.max(1))?,
            },
            batch_size: dim(self.batch)?,
            stride_a: stride(self.sa)?,
            stride_b: stride(self.sb)?,
            stride_c: stride(self.sc)?,
        };
        // SAFETY: the callers below derive every dimension, leading dimension
        // and stride from one checked `AttnShape`, and each view starts at
        // the first head of one sequence, so the last head's last element
        // stays inside that sequence's rows of the buffer.
        unsafe { blas.gemm_strided_batched(cfg, a, b, c) }.map_err(cuda_err)
    }
}

/// Shorthands for one call's sizes: `t` tokens, `dh` head width, `w` the
/// output row width, `w3` the qkv row width, `tt` one score block.
struct Dims {
    t: usize,
    dh: usize,
    w: usize,
    w3: usize,
    tt: usize,
    heads: usize,
    scale: f32,
}

impl Dims {
    fn new(sh: AttnShape) -> Self {
        let w = sh.width();
        Self {
            t: sh.seq,
            dh: sh.head_dim,
            w,
            w3: 3 * w,
            tt: sh.seq * sh.seq,
            heads: sh.heads,
            scale: 1.0 / (sh.head_dim as f32).sqrt(),
        }
    }

    /// `C[t x t] = alpha X[t x dh] Y[t x dh]^T`, with X, Y rows `ldx`/`ldy`
    /// apart: column-major `C^T = alpha Y X^T` (Y as A, transposed).
    fn nt_square(&self, alpha: f32, ldx: usize, sx: usize, ldy: usize, sy: usize) -> Batched {
        Batched {
            ta: CUBLAS_OP_T,
            tb: CUBLAS_OP_N,
            m: self.t,
            n: self.t,
            k: self.dh,
            alpha,
            lda: ldy,
            ldb: ldx,
            ldc: self.t,
            sa: sy,
            sb: sx,
            sc: self.tt,
            batch: self.heads,
        }
    }

    /// `C[t x dh] = alpha op(P)[t x t] Y[t x dh]` with `P` a dense score
    /// block (transposed when `p_t`), Y rows `ldy` apart, C rows `ldc`
    /// apart: column-major `C^T = alpha Y^T op(P)^T` (Y as A, untransposed;
    /// P as B, transposed in cuBLAS's terms exactly when it is not in ours).
    fn square_n(&self, alpha: f32, p_t: bool, ldy: usize, ldc: usize) -> Batched {
        Batched {
            ta: CUBLAS_OP_N,
            tb: if p_t { CUBLAS_OP_T } else { CUBLAS_OP_N },
            m: self.dh,
            n: self.t,
            k: self.t,
            alpha,
            lda: ldy,
            ldb: self.t,
            ldc,
            sa: self.dh,
            sb: self.tt,
            sc: self.dh,
            batch: self.heads,
        }
    }
}

/// Forward: fills `out` (`[batch, seq, w]`) and `probs`
/// (`[batch, heads, seq, seq]`) from `qkv`; all shapes checked by the caller.
pub(super) fn forward<E: Exec>(
    e: &mut E,
    qkv: &E::Buf,
    sh: AttnShape,
    out: &mut E::Buf,
    probs: &mut E::Buf,
) -> Result<()> {
    if sh.batch * sh.seq * sh.heads == 0 {
        return Ok(());
    }
    let d = Dims::new(sh);
    // S = scale Q K^T into the probability buffer, then softmax in place.
    let scores = d.nt_square(d.scale, d.w3, d.dh, d.w3, d.dh);
    for b in 0..sh.batch {
        let base = b * d.t * d.w3;
        let pbase = b * d.heads * d.tt;
        e.gemm(&scores, (qkv, base + d.w), (qkv, base), (probs, pbase))?;
    }
    e.causal_softmax(probs, d.t)?;
    // O = P V, each head into its columns of the output rows.
    let pv = d.square_n(1.0, false, d.w3, d.w);
    for b in 0..sh.batch {
        let (base, obase, pbase) = (b * d.t * d.w3, b * d.t * d.w, b * d.heads * d.tt);
        e.gemm(&pv, (qkv, base + 2 * d.w), (probs, pbase), (out, obase))?;
    }
    Ok(())
}

/// Backward: fills `dqkv` (shape of `qkv`) from the forward's `qkv` and
/// `probs` and the output gradient `dout`; `ds` is scratch of the shape of
/// `probs`. Same formulas as the CPU op:
/// `dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP - rowsum(P * dP))`,
/// `dQ = scale dS K`, `dK = scale dS^T Q`. Every element of `dqkv` and `ds`
/// is overwritten (GEMMs with beta = 0), so neither needs zeroing.
pub(super) fn backward<E: Exec>(
    e: &mut E,
    qkv: &E::Buf,
    probs: &E::Buf,
    dout: &E::Buf,
    sh: AttnShape,
    ds: &mut E::Buf,
    dqkv: &mut E::Buf,
) -> Result<()> {
    if sh.batch * sh.seq * sh.heads == 0 {
        return Ok(());
    }
    let d = Dims::new(sh);
    // dV = P^T dO: Y = dO (rows w apart), into V's columns of dqkv.
    let dv = d.square_n(1.0, true, d.w, d.w3);
    // dP = dO V^T: X = dO (rows w apart), Y = V (rows 3w apart).
    let dp = d.nt_square(1.0, d.w, d.dh, d.w3, d.dh);
    for b in 0..sh.batch {
        let (base, obase, pbase) = (b * d.t * d.w3, b * d.t * d.w, b * d.heads * d.tt);
        e.gemm(&dv, (dout, obase), (probs, pbase), (dqkv, base + 2 * d.w))?;
        e.gemm(&dp, (qkv, base + 2 * d.w), (dout, obase), (ds, pbase))?;
    }
    e.softmax_backward(ds, probs, d.t)?;
    // dQ = scale dS K into Q's columns; dK = scale dS^T Q into K's.
    let dq = d.square_n(d.scale, false, d.w3, d.w3);
    let dk = d.square_n(d.scale, true, d.w3, d.w3);
    for b in 0..sh.batch {
        let (base, pbase) = (b * d.t * d.w3, b * d.heads * d.tt);
        e.gemm(&dq, (qkv, base + d.w), (ds, pbase), (dqkv, base))?;
        e.gemm(&dk, (qkv, base), (ds, pbase), (dqkv, base + d.w))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The GEMM plans above, run on a host emulation of cuBLAS's
    //! column-major strided-batched sgemm (argument checks included) and of
    //! the softmax kernels, against the CPU op: checks every transpose flag,
    //! leading dimension, stride and offset without a GPU.

    use super::*;
    use crate::cpu;
    use crate::init::normal_tensor;

    struct Host;

    impl Exec for Host {
        type Buf = Vec<f32>;

        fn gemm(
            &mut self,
            g: &Batched,
            (a, ao): (&Vec<f32>, usize),
            (b, bo): (&Vec<f32>, usize),
            (c, co): (&mut Vec<f32>, usize),
        ) -> Result<()> {
            let (ta, tb) = (g.ta == CUBLAS_OP_T, g.tb == CUBLAS_OP_T);
            // cuBLAS rejects leading dimensions below the stored rows.
            assert!(g.lda.max(1) >= if ta { g.k } else { g.m }.max(1), "lda");
            assert!(g.ldb.max(1) >= if tb { g.n } else { g.k }.max(1), "ldb");
            assert!(g.ldc.max(1) >= g.m.max(1), "ldc");
            for i in 0..g.batch {
                let (ai, bi, ci) = (ao + i * g.sa, bo + i * g.sb, co + i * g.sc);
                for col in 0..g.n {
                    for row in 0..g.m {
                        let mut s = 0.0f64;
                        for p in 0..g.k {
                            let av = if ta {
                                a[ai + p + row * g.lda]
                            } else {
                                a[ai + row + p * g.lda]
                            };
                            let bv = if tb {
                                b[bi + col + p * g.ldb]
                            } else {
                                b[bi + p + col * g.ldb]
                            };
                            s += av as f64 * bv as f64;
                        }
                        c[ci + row + col * g.ldc] = g.alpha * s as f32;
                    }
                }
            }
            Ok(())
        }

        fn causal_softmax(&mut self, probs: &mut Vec<f32>, t: usize) -> Result<()> {
            for (r, row) in probs.chunks_exact_mut(t).enumerate() {
                let q = r % t;
                let max = row[..=q].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row[..=q].iter_mut().for_each(|v| *v = (*v - max).exp());
                let sum: f32 = row[..=q].iter().sum();
                row[..=q].iter_mut().for_each(|v| *v /= sum);
                row[q + 1..].iter_mut().for_each(|v| *v = 0.0);
            }
            Ok(())
        }

        fn softmax_backward(&mut self, ds: &mut Vec<f32>, p: &Vec<f32>, t: usize) -> Result<()> {
            for (d, p) in ds.chunks_exact_mut(t).zip(p.chunks_exact(t)) {
                let dot: f32 = d.iter().zip(p).map(|(a, b)| a * b).sum();
                d.iter_mut().zip(p).for_each(|(d, p)| *d = p * (*d - dot));
            }
            Ok(())
        }
    }

    fn close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn gemm_plans_match_the_cpu_op() {
        let shapes = [(2, 5, 3, 4), (1, 1, 1, 1), (3, 7, 1, 8), (2, 4, 4, 2)];
        for (batch, seq, heads, head_dim) in shapes {
            let sh = AttnShape {
                batch,
                seq,
                heads,
                head_dim,
            };
            let tag = format!("{sh:?}");
            let qkv = normal_tensor(&[batch * seq, 3 * sh.width()], 1.0, 5, &tag);
            let dout = normal_tensor(&[batch, seq, sh.width()], 1.0, 6, &tag);
            let (out, probs) = cpu::causal_attention(&qkv, sh).unwrap();
            let dqkv = cpu::causal_attention_backward(&qkv, &probs, &dout, sh).unwrap();

            // NaN everywhere the plans must overwrite.
            let (q, go) = (qkv.data().to_vec(), dout.data().to_vec());
            let mut o = vec![f32::NAN; out.numel()];
            let mut p = vec![f32::NAN; probs.numel()];
            forward(&mut Host, &q, sh, &mut o, &mut p).unwrap();
            close(&format!("{tag} out"), &o, out.data());
            close(&format!("{tag} probs"), &p, probs.data());

            let mut ds = vec![f32::NAN; probs.numel()];
            let mut dq = vec![f32::NAN; qkv.numel()];
            backward(&mut Host, &q, &p, &go, sh, &mut ds, &mut dq).unwrap();
            close(&format!("{tag} dqkv"), &dq, dqkv.data());
        }
    }
}
