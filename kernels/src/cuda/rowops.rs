//! Row-wise and gather/scatter kernels, compiled once per backend with NVRTC:
//! LayerNorm, softmax cross-entropy, embedding and the causal softmax of
//! attention (whose products run on cuBLAS, see `attention.rs`).
//!
//! Kernels are deliberately simple (one thread per row, or per column for
//! the weight gradients) and follow the CPU ops' formulas and accumulation
//! precision (f64 where the CPU uses f64), so results agree to rounding.
//! Callers check every shape before launching: the kernels trust them.

use super::{cuda_err, CudaTensor};
use crate::error::{KernelError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchArgs, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

const SOURCE: &str = r#"
// NVRTC compiles without headers, so -inf comes from its bit pattern.
#define NEG_INF __int_as_float(0xff800000)

// LayerNorm forward, one thread per row; mean and variance in double as on
// the CPU (biased variance).
extern "C" __global__ void ln_fwd(float* y, float* xhat, float* rstd, const float* x,
                                  const float* gamma, const float* beta,
                                  int rows, int n, float eps) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    long long off = (long long)r * n;
    const float* xr = x + off;
    float* xh = xhat + off;
    float* yr = y + off;
    double sum = 0.0;
    for (int j = 0; j < n; ++j) sum += (double)xr[j];
    double mean = sum / (double)n;
    double var = 0.0;
    for (int j = 0; j < n; ++j) {
        double d = (double)xr[j] - mean;
        var += d * d;
    }
    var /= (double)n;
    float rs = (float)(1.0 / sqrt(var + (double)eps));
    float m = (float)mean;
    for (int j = 0; j < n; ++j) {
        float h = (xr[j] - m) * rs;
        xh[j] = h;
        yr[j] = h * gamma[j] + beta[j];
    }
    rstd[r] = rs;
}

// LayerNorm input gradient, one thread per row:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
extern "C" __global__ void ln_bwd_input(float* dx, const float* dy, const float* gamma,
                                        const float* xhat, const float* rstd,
                                        int rows, int n) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    long long off = (long long)r * n;
    const float* dyr = dy + off;
    const float* xh = xhat + off;
    float* dxr = dx + off;
    double sg = 0.0, sgx = 0.0;
    for (int j = 0; j < n; ++j) {
        double g = (double)(dyr[j] * gamma[j]);
        sg += g;
        sgx += g * (double)xh[j];
    }
    float mg = (float)(sg / (double)n);
    float mgx = (float)(sgx / (double)n);
    float rs = rstd[r];
    for (int j = 0; j < n; ++j) dxr[j] = rs * (dyr[j] * gamma[j] - mg - xh[j] * mgx);
}

// LayerNorm weight gradients, one thread per column, accumulating into the
// existing gradients row by row in the CPU's order.
extern "C" __global__ void ln_bwd_weight(float* dgamma, float* dbeta, const float* dy,
                                         const float* xhat, int rows, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float g = dgamma[j];
    float b = dbeta[j];
    for (int r = 0; r < rows; ++r) {
        long long i = (long long)r * n + j;
        g += dy[i] * xhat[i];
        b += dy[i];
    }
    dgamma[j] = g;
    dbeta[j] = b;
}

// Softmax cross-entropy forward, one thread per row: probabilities in
// place of the CPU's, and each row's loss in log-sum-exp form (in double,
// summed on the host as the CPU does).
extern "C" __global__ void ce_fwd(float* probs, double* row_loss, const float* logits,
                                  const unsigned int* targets, int rows, int v) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    long long off = (long long)r * v;
    const float* z = logits + off;
    float* p = probs + off;
    float mx = NEG_INF;
    for (int j = 0; j < v; ++j) mx = fmaxf(mx, z[j]);
    double sum = 0.0;
    for (int j = 0; j < v; ++j) {
        float e = expf(z[j] - mx);
        p[j] = e;
        sum += (double)e;
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < v; ++j) p[j] *= inv;
    row_loss[r] = log(sum) + (double)(mx - z[targets[r]]);
}

// Cross-entropy backward in place over probs: k * (p - onehot(target)).
extern "C" __global__ void ce_bwd(float* g, const unsigned int* targets, int n, int v, float k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = i / v;
    int j = i - r * v;
    float x = g[i];
    if ((unsigned int)j == targets[r]) x -= 1.0f;
    g[i] = x * k;
}

// Embedding forward, one thread per output element of the [rows, d] result:
// out[r] = wte[ids[r]] + wpe[r % seq].
extern "C" __global__ void emb_fwd(float* out, const unsigned int* ids, const float* wte,
                                   const float* wpe, int n, int d, int seq) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = i / d;
    int j = i - r * d;
    out[i] = wte[(long long)ids[r] * d + j] + wpe[(long long)(r % seq) * d + j];
}

// Embedding weight gradient: a scatter-add, atomic because several rows may
// share a token (and every sequence shares the positions).
extern "C" __global__ void emb_bwd(float* dwte, float* dwpe, const unsigned int* ids,
                                   const float* dy, int n, int d, int seq) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = i / d;
    int j = i - r * d;
    float g = dy[i];
    atomicAdd(&dwte[(long long)ids[r] * d + j], g);
    atomicAdd(&dwpe[(long long)(r % seq) * d + j], g);
}

// Causal softmax in place over rows of t x t score blocks, one thread per
// row; row r is query r % t, which sees keys 0..=r % t. Masked entries
// become exactly 0, as on the CPU.
extern "C" __global__ void causal_softmax(float* s, int rows, int t) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float* row = s + (long long)r * t;
    int q = r % t;
    float mx = NEG_INF;
    for (int j = 0; j <= q; ++j) mx = fmaxf(mx, row[j]);
    float sum = 0.0f;
    for (int j = 0; j <= q; ++j) {
        float e = expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j <= q; ++j) row[j] *= inv;
    for (int j = q + 1; j < t; ++j) row[j] = 0.0f;
}

// Softmax backward in place over dP, one thread per row:
// dS = P * (dP - rowsum(P * dP)); masked entries have P == 0, so dS == 0.
extern "C" __global__ void softmax_bwd(float* ds, const float* p, int rows, int t) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    long long off = (long long)r * t;
    const float* pr = p + off;
    float* dr = ds + off;
    float dot = 0.0f;
    for (int j = 0; j < t; ++j) dot += pr[j] * dr[j];
    for (int j = 0; j < t; ++j) dr[j] = pr[j] * (dr[j] - dot);
}
"#;

pub(super) struct RowKernels {
    ln_fwd: CudaFunction,
    ln_bwd_input: CudaFunction,
    ln_bwd_weight: CudaFunction,
    ce_fwd: CudaFunction,
    ce_bwd: CudaFunction,
    emb_fwd: CudaFunction,
    emb_bwd: CudaFunction,
    causal_softmax: CudaFunction,
    softmax_bwd: CudaFunction,
}

/// A count as the kernels' `int`.
pub(super) fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} exceeds a kernel's int")))
}

/// Enough 1024-thread blocks for `n` threads (at least one block).
fn grid(n: usize) -> Result<LaunchConfig> {
    let n = u32::try_from(n.max(1))
        .map_err(|_| KernelError::Cuda(format!("{n} threads exceed a grid")))?;
    Ok(LaunchConfig::for_num_elems(n))
}

/// Launches with one thread per `threads` item.
///
/// # Safety
/// The arguments pushed on `b` must match the kernel's signature, and every
/// buffer must hold what the kernel indexes for `threads` threads.
unsafe fn launch(mut b: LaunchArgs<'_>, threads: usize) -> Result<()> {
    let cfg = grid(threads)?;
    // SAFETY: forwarded to the caller.
    unsafe { b.launch(cfg) }.map(drop).map_err(cuda_err)
}

impl RowKernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(cuda_err)?;
        let module = ctx.load_module(ptx).map_err(cuda_err)?;
        let f = |name: &str| module.load_function(name).map_err(cuda_err);
        Ok(Self {
            ln_fwd: f("ln_fwd")?,
            ln_bwd_input: f("ln_bwd_input")?,
            ln_bwd_weight: f("ln_bwd_weight")?,
            ce_fwd: f("ce_fwd")?,
            ce_bwd: f("ce_bwd")?,
            emb_fwd: f("emb_fwd")?,
            emb_bwd: f("emb_bwd")?,
            causal_softmax: f("causal_softmax")?,
            softmax_bwd: f("softmax_bwd")?,
        })
    }

    /// `x`, `y`, `xhat` are `[rows, n]`; `gamma`, `beta` `[n]`; `rstd` `[rows]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer_norm(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        gamma: &CudaTensor,
        beta: &CudaTensor,
        eps: f32,
        y: &mut CudaTensor,
        xhat: &mut CudaTensor,
        rstd: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, n) = (int(x.rows())?, int(x.cols())?);
        let mut b = s.launch_builder(&self.ln_fwd);
        b.arg(&mut y.data).arg(&mut xhat.data).arg(&mut rstd.data);
        b.arg(&x.data).arg(&gamma.data).arg(&beta.data);
        b.arg(&rows).arg(&n).arg(&eps);
        // SAFETY: shapes checked by the caller; thread r touches row r only.
        unsafe { launch(b, x.rows()) }
    }

    /// `dy`, `xhat`, `dx` are `[rows, n]`; `gamma` `[n]`; `rstd` `[rows]`.
    pub(super) fn layer_norm_backward_input(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        xhat: &CudaTensor,
        rstd: &CudaTensor,
        dx: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, n) = (int(dy.rows())?, int(dy.cols())?);
        let mut b = s.launch_builder(&self.ln_bwd_input);
        b.arg(&mut dx.data).arg(&dy.data).arg(&gamma.data);
        b.arg(&xhat.data).arg(&rstd.data).arg(&rows).arg(&n);
        // SAFETY: shapes checked by the caller; thread r touches row r only.
        unsafe { launch(b, dy.rows()) }
    }

    /// `dy`, `xhat` are `[rows, n]`; `dgamma`, `dbeta` `[n]` (accumulated).
    pub(super) fn layer_norm_backward_weight(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        xhat: &CudaTensor,
        dgamma: &mut CudaTensor,
        dbeta: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, n) = (int(dy.rows())?, int(dy.cols())?);
        let mut b = s.launch_builder(&self.ln_bwd_weight);
        b.arg(&mut dgamma.data).arg(&mut dbeta.data);
        b.arg(&dy.data).arg(&xhat.data).arg(&rows).arg(&n);
        // SAFETY: shapes checked by the caller; thread j touches column j only.
        unsafe { launch(b, dy.cols()) }
    }

    /// `logits`, `probs` are `[rows, v]`; `targets` and `row_loss` `[rows]`,
    /// every target below `v` (checked by the caller).
    pub(super) fn cross_entropy(
        &self,
        s: &Arc<CudaStream>,
        logits: &CudaTensor,
        targets: &CudaSlice<u32>,
        probs: &mut CudaTensor,
        row_loss: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let (rows, v) = (int(logits.rows())?, int(logits.cols())?);
        let mut b = s.launch_builder(&self.ce_fwd);
        b.arg(&mut probs.data).arg(row_loss).arg(&logits.data);
        b.arg(targets).arg(&rows).arg(&v);
        // SAFETY: shapes and target range checked by the caller; thread r
        // touches row r only.
        unsafe { launch(b, logits.rows()) }
    }

    /// `probs` is `[rows, v]` and becomes the gradient; `targets` `[rows]`.
    pub(super) fn cross_entropy_backward(
        &self,
        s: &Arc<CudaStream>,
        probs: &mut CudaTensor,
        targets: &CudaSlice<u32>,
        k: f32,
    ) -> Result<()> {
        let (numel, v) = (probs.numel(), int(probs.cols())?);
        let n = int(numel)?;
        let mut b = s.launch_builder(&self.ce_bwd);
        b.arg(&mut probs.data).arg(targets).arg(&n).arg(&v).arg(&k);
        // SAFETY: shapes checked by the caller; guarded by i < n, and
        // i / v < rows whenever i < rows * v.
        unsafe { launch(b, numel) }
    }

    /// `ids` `[rows]` (each below the vocabulary, checked by the caller),
    /// tables `[vocab, d]` and `[positions >= seq, d]`, `out` `[rows, d]`.
    pub(super) fn embedding(
        &self,
        s: &Arc<CudaStream>,
        ids: &CudaSlice<u32>,
        seq: usize,
        wte: &CudaTensor,
        wpe: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (numel, d, seq) = (out.numel(), int(out.cols())?, int(seq)?);
        let n = int(numel)?;
        let mut b = s.launch_builder(&self.emb_fwd);
        b.arg(&mut out.data).arg(ids).arg(&wte.data).arg(&wpe.data);
        b.arg(&n).arg(&d).arg(&seq);
        // SAFETY: shapes and ids checked by the caller; guarded by i < n.
        unsafe { launch(b, numel) }
    }

    /// The scatter-add of `dy` (`[rows, d]`) into `dwte` and `dwpe`.
    pub(super) fn embedding_backward_weight(
        &self,
        s: &Arc<CudaStream>,
        ids: &CudaSlice<u32>,
        seq: usize,
        dy: &CudaTensor,
        dwte: &mut CudaTensor,
        dwpe: &mut CudaTensor,
    ) -> Result<()> {
        let (numel, d, seq) = (dy.numel(), int(dwte.cols())?, int(seq)?);
        let n = int(numel)?;
        let mut b = s.launch_builder(&self.emb_bwd);
        b.arg(&mut dwte.data)
            .arg(&mut dwpe.data)
            .arg(ids)
            .arg(&dy.data);
        b.arg(&n).arg(&d).arg(&seq);
        // SAFETY: shapes and ids checked by the caller; guarded by i < n.
        unsafe { launch(b, numel) }
    }

    /// Causal softmax in place over `probs` (`[.., t, t]` blocks).
    pub(super) fn causal_softmax(
        &self,
        s: &Arc<CudaStream>,
        probs: &mut CudaTensor,
        t: usize,
    ) -> Result<()> {
        let rows = probs.numel() / t.max(1);
        let (r, ti) = (int(rows)?, int(t)?);
        let mut b = s.launch_builder(&self.causal_softmax);
        b.arg(&mut probs.data).arg(&r).arg(&ti);
        // SAFETY: probs holds rows * t floats; thread r touches row r only.
        unsafe { launch(b, rows) }
    }

    /// Softmax backward in place over `ds` (holding dP), with the saved `probs`.
    pub(super) fn softmax_backward(
        &self,
        s: &Arc<CudaStream>,
        ds: &mut CudaTensor,
        probs: &CudaTensor,
        t: usize,
    ) -> Result<()> {
        let rows = probs.numel() / t.max(1);
        let (r, ti) = (int(rows)?, int(t)?);
        let mut b = s.launch_builder(&self.softmax_bwd);
        b.arg(&mut ds.data).arg(&probs.data).arg(&r).arg(&ti);
        // SAFETY: both hold rows * t floats (same shape, checked by the
        // caller); thread r touches row r only.
        unsafe { launch(b, rows) }
    }
}
