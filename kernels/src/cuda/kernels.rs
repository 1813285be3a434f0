//! Elementwise kernels, compiled once per backend with NVRTC.

use super::{cuda_err, CudaTensor};
use crate::error::{KernelError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Same formulas as the CPU ops (GeLU in its tanh form).
const SOURCE: &str = r#"
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
extern "C" __global__ void add(float* out, const float* a, const float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void add_bias(float* x, const float* b, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % cols];
}
// One thread per column, summing down the rows: coalesced across threads.
extern "C" __global__ void bias_grad(float* acc, const float* dy, int rows, int cols) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < cols) {
        float s = 0.0f;
        for (int r = 0; r < rows; ++r) s += dy[r * cols + j];
        acc[j] += s;
    }
}
"#;

pub(super) struct Kernels {
    gelu_fwd: CudaFunction,
    gelu_bwd: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    bias_grad: CudaFunction,
}

fn len(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} elements exceed a kernel's int")))
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

impl Kernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(cuda_err)?;
        let module = ctx.load_module(ptx).map_err(cuda_err)?;
        let f = |name: &str| module.load_function(name).map_err(cuda_err);
        Ok(Self {
            gelu_fwd: f("gelu_fwd")?,
            gelu_bwd: f("gelu_bwd")?,
            add: f("add")?,
            add_bias: f("add_bias")?,
            bias_grad: f("bias_grad")?,
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

    pub(super) fn bias_grad_acc(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        acc: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, cols) = (len(dy.rows())?, len(dy.cols())?);
        let mut b = s.launch_builder(&self.bias_grad);
        b.arg(&mut acc.data).arg(&dy.data).arg(&rows).arg(&cols);
        // SAFETY: acc holds cols floats (checked), dy rows*cols; guarded by j < cols.
        unsafe { b.launch(grid(dy.cols())) }
            .map(drop)
            .map_err(cuda_err)
    }
}
