//! Elementwise kernels, compiled once per backend with NVRTC.

use super::{cuda_err, CudaTensor};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use pipewright_kernels_core::backend::AdamWUpdate;
use pipewright_kernels_core::error::{KernelError, Result};
use std::sync::Arc;

/// Same formulas as the CPU ops (GeLU in its tanh form).
pub(super) const SOURCE: &str = r#"
#define GELU_C 0.7978845608f
#define GELU_A 0.044715f
extern "C" __global__ void gelu_fwd(float* out, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(GELU_C * (v + GELU_A * v * v * v)));
    }
}
extern "C" __global__ void gelu_bwd(float* out, const float* x, const float* dy, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
        float dt = (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * v * v);
        out[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
}
// Gated linear units on a fused [rows, 2f] pre-activation h (gate columns,
// then up columns): out[r, j] = act(h[r, j]) * h[r, f + j], act SiLU
// (act == 0, SwiGLU) or the tanh GeLU above (act == 1, GeGLU). One thread
// per output element; n = rows * f.
__device__ __forceinline__ void glu_act(float g, int act, float* a, float* slope) {
    if (act == 0) {
        float s = 1.0f / (1.0f + expf(-g));
        *a = g * s;
        *slope = s * (1.0f + g * (1.0f - s));
    } else {
        float t = tanhf(GELU_C * (g + GELU_A * g * g * g));
        float dt = (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * g * g);
        *a = 0.5f * g * (1.0f + t);
        *slope = 0.5f * (1.0f + t) + 0.5f * g * dt;
    }
}
extern "C" __global__ void glu_fwd(float* out, const float* h, int n, int f, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i / f, j = i - r * f, g = r * 2 * f + j;
    float a, slope;
    glu_act(h[g], act, &a, &slope);
    out[i] = a * h[g + f];
}
// dh[r, j] = da * up * act'(gate), dh[r, f + j] = da * act(gate).
extern "C" __global__ void glu_bwd(float* dh, const float* h, const float* da, int n, int f,
                                   int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i / f, j = i - r * f, g = r * 2 * f + j;
    float a, slope;
    glu_act(h[g], act, &a, &slope);
    dh[g] = da[i] * h[g + f] * slope;
    dh[g + f] = da[i] * a;
}
extern "C" __global__ void add(float* out, const float* a, const float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void add_bias(float* x, const float* b, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % cols];
}
extern "C" __global__ void add_assign(float* a, const float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}
extern "C" __global__ void scale(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
// AdamW, statement for statement the CPU's `adamw_update` (cpu/adamw.rs).
extern "C" __global__ void adamw(float* x, const float* g, float* m, float* v, int n,
                                 float lr, float beta1, float beta2, float eps,
                                 float shrink, float bc1, float bc2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float xi = x[i] * shrink;
    x[i] = xi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}
"#;

/// The kernels loaded from [`SOURCE`], in [`Kernels`]' field order.
pub(super) const NAMES: &[&str] = &[
    "gelu_fwd",
    "gelu_bwd",
    "glu_fwd",
    "glu_bwd",
    "add",
    "add_bias",
    "add_assign",
    "scale",
    "adamw",
];

#[derive(Clone)]
pub(super) struct Kernels {
    gelu_fwd: CudaFunction,
    gelu_bwd: CudaFunction,
    glu_fwd: CudaFunction,
    glu_bwd: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    add_assign: CudaFunction,
    scale: CudaFunction,
    adamw: CudaFunction,
}

fn len(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} elements exceed a kernel's int")))
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

impl Kernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut f = super::nvrtc::load(ctx, SOURCE, NAMES)?.into_iter();
        let mut next = || f.next().expect("one function per name");
        Ok(Self {
            gelu_fwd: next(),
            gelu_bwd: next(),
            glu_fwd: next(),
            glu_bwd: next(),
            add: next(),
            add_bias: next(),
            add_assign: next(),
            scale: next(),
            adamw: next(),
        })
    }

    pub(super) fn gelu(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let n = len(x.numel())?;
        let mut b = s.launch_builder(&self.gelu_fwd);
        b.arg(&mut out.data).arg(&x.data).arg(&n);
        // SAFETY: out and x hold n floats; the kernel guards i < n.
        unsafe { b.launch(grid(x.numel())) }
            .map(drop)
            .map_err(cuda_err)
    }

    pub(super) fn gelu_backward(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        dy: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let n = len(x.numel())?;
        let mut b = s.launch_builder(&self.gelu_bwd);
        b.arg(&mut out.data).arg(&x.data).arg(&dy.data).arg(&n);
        // SAFETY: all three hold n floats (checked shapes); guarded by i < n.
        unsafe { b.launch(grid(x.numel())) }
            .map(drop)
            .map_err(cuda_err)
    }

    /// `out` (`[rows, f]`) from the fused `h` (`[rows, 2f]`); shapes checked by the caller.
    pub(super) fn glu(
        &self,
        s: &Arc<CudaStream>,
        h: &CudaTensor,
        act: i32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (numel, f) = (out.numel(), len(out.cols())?);
        if numel == 0 {
            return Ok(());
        }
        let n = len(numel)?;
        let mut b = s.launch_builder(&self.glu_fwd);
        b.arg(&mut out.data).arg(&h.data).arg(&n).arg(&f).arg(&act);
        // SAFETY: out holds n = rows * f floats, h 2n (checked shapes); guarded by i < n.
        unsafe { b.launch(grid(numel)) }.map(drop).map_err(cuda_err)
    }

    /// `dh` (`[rows, 2f]`, every element) from `h` and `da` (`[rows, f]`).
    pub(super) fn glu_backward(
        &self,
        s: &Arc<CudaStream>,
        h: &CudaTensor,
        da: &CudaTensor,
        act: i32,
        dh: &mut CudaTensor,
    ) -> Result<()> {
        let (numel, f) = (da.numel(), len(da.cols())?);
        if numel == 0 {
            return Ok(());
        }
        let n = len(numel)?;
        let mut b = s.launch_builder(&self.glu_bwd);
        b.arg(&mut dh.data).arg(&h.data).arg(&da.data);
        b.arg(&n).arg(&f).arg(&act);
        // SAFETY: da holds n = rows * f floats, h and dh 2n (checked shapes); guarded by i < n.
        unsafe { b.launch(grid(numel)) }.map(drop).map_err(cuda_err)
    }

    pub(super) fn add(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        y: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let n = len(x.numel())?;
        let mut b = s.launch_builder(&self.add);
        b.arg(&mut out.data).arg(&x.data).arg(&y.data).arg(&n);
        // SAFETY: all three hold n floats (checked shapes); guarded by i < n.
        unsafe { b.launch(grid(x.numel())) }
            .map(drop)
            .map_err(cuda_err)
    }

    pub(super) fn add_bias(
        &self,
        s: &Arc<CudaStream>,
        x: &mut CudaTensor,
        bias: &CudaTensor,
    ) -> Result<()> {
        let (numel, cols) = (x.numel(), len(x.cols().max(1))?);
        let n = len(numel)?;
        let mut b = s.launch_builder(&self.add_bias);
        b.arg(&mut x.data).arg(&bias.data).arg(&n).arg(&cols);
        // SAFETY: bias holds cols floats (checked), x holds n; guarded by i < n.
        unsafe { b.launch(grid(numel)) }.map(drop).map_err(cuda_err)
    }

    pub(super) fn add_assign(
        &self,
        s: &Arc<CudaStream>,
        a: &mut CudaTensor,
        b: &CudaTensor,
    ) -> Result<()> {
        let (numel, n) = (a.numel(), len(a.numel())?);
        let mut lb = s.launch_builder(&self.add_assign);
        lb.arg(&mut a.data).arg(&b.data).arg(&n);
        // SAFETY: both hold n floats (checked shapes); guarded by i < n.
        unsafe { lb.launch(grid(numel)) }
            .map(drop)
            .map_err(cuda_err)
    }

    pub(super) fn scale(&self, s: &Arc<CudaStream>, x: &mut CudaTensor, k: f32) -> Result<()> {
        let (numel, n) = (x.numel(), len(x.numel())?);
        let mut lb = s.launch_builder(&self.scale);
        lb.arg(&mut x.data).arg(&k).arg(&n);
        // SAFETY: x holds n floats; guarded by i < n.
        unsafe { lb.launch(grid(numel)) }
            .map(drop)
            .map_err(cuda_err)
    }

    /// Launches the AdamW kernel; `g`, `m` and `v` have `x`'s shape (checked
    /// by the caller).
    pub(super) fn adamw(
        &self,
        s: &Arc<CudaStream>,
        x: &mut CudaTensor,
        g: &CudaTensor,
        state: (&mut CudaTensor, &mut CudaTensor),
        h: &AdamWUpdate,
    ) -> Result<()> {
        let (numel, n) = (x.numel(), len(x.numel())?);
        let (m, v) = state;
        let mut lb = s.launch_builder(&self.adamw);
        lb.arg(&mut x.data)
            .arg(&g.data)
            .arg(&mut m.data)
            .arg(&mut v.data);
        lb.arg(&n)
            .arg(&h.lr)
            .arg(&h.beta1)
            .arg(&h.beta2)
            .arg(&h.eps);
        lb.arg(&h.shrink).arg(&h.bc1).arg(&h.bc2);
        // SAFETY: all four hold n floats (checked shapes); guarded by i < n;
        // the arguments match the kernel's (4 pointers, int, 7 floats).
        unsafe { lb.launch(grid(numel)) }
            .map(drop)
            .map_err(cuda_err)
    }
}
