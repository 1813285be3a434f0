//! The CUDA backend (cargo feature `cuda`): device tensors, explicit copies,
//! cuBLAS matmuls and NVRTC-compiled elementwise kernels.
//!
//! cudarc loads the CUDA libraries at run time and panics if one is missing,
//! so [`CudaBackend::new`] first checks that the driver, NVRTC and cuBLAS
//! libraries are present and returns [`KernelError::CudaUnavailable`]
//! otherwise; tests use that to skip with a message on machines without a GPU.

mod blas;
mod kernels;

use crate::backend::Backend;
use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;

/// A dense row-major f32 tensor in device memory.
#[derive(Debug)]
pub struct CudaTensor {
    shape: Vec<usize>,
    data: CudaSlice<f32>,
}

impl CudaTensor {
    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the last dimension.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Product of all dimensions but the last.
    pub fn rows(&self) -> usize {
        self.numel().checked_div(self.cols()).unwrap_or(0)
    }
}

/// Why CUDA cannot be used here, or `None` if its libraries are present.
pub fn missing_library() -> Option<&'static str> {
    // SAFETY: these only try to dlopen the libraries; no CUDA call is made.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Some("the CUDA driver library (libcuda) is not present");
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Some("the NVRTC library is not present");
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Some("the cuBLAS library is not present");
        }
    }
    None
}

fn cuda_err(e: impl std::fmt::Debug) -> KernelError {
    KernelError::Cuda(format!("{e:?}"))
}

/// One GPU: its context, a stream, a cuBLAS handle and the compiled kernels.
/// All work is queued on the one stream, so it runs in call order.
pub struct CudaBackend {
    ordinal: usize,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: kernels::Kernels,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend(cuda:{})", self.ordinal)
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal` and compiles the kernels; errors with
    /// [`KernelError::CudaUnavailable`] if a library or the device is missing.
    pub fn new(ordinal: usize) -> Result<Self> {
        if let Some(why) = missing_library() {
            return Err(KernelError::CudaUnavailable(why.into()));
        }
        let count = CudaContext::device_count()
            .map_err(|e| KernelError::CudaUnavailable(format!("no usable device: {e:?}")))?;
        if ordinal as i64 >= count as i64 {
            return Err(KernelError::CudaUnavailable(format!(
                "device {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(cuda_err)?;
        let kernels = kernels::Kernels::compile(&ctx)?;
        Ok(Self {
            ordinal,
            stream,
            blas,
            kernels,
        })
    }

    /// A zero tensor on the device.
    pub fn zeros(&self, shape: &[usize]) -> Result<CudaTensor> {
        let data = self
            .stream
            .alloc_zeros::<f32>(shape.iter().product())
            .map_err(cuda_err)?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }
}

fn same_shape(op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if a.shape != b.shape {
        return Err(shape_err(op, format!("{:?} vs {:?}", a.shape, b.shape)));
    }
    Ok(())
}

fn bias_shape(op: &'static str, x: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if b.shape != [x.cols()] {
        return Err(shape_err(
            op,
            format!("bias {:?} for {:?}", b.shape, x.shape),
        ));
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Storage = CudaTensor;

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn upload(&self, t: &Tensor) -> Result<CudaTensor> {
        let data = self.stream.clone_htod(t.data()).map_err(cuda_err)?;
        Ok(CudaTensor {
            shape: t.shape().to_vec(),
            data,
        })
    }

    fn download(&self, t: &CudaTensor) -> Result<Tensor> {
        let data = self.stream.clone_dtoh(&t.data).map_err(cuda_err)?;
        self.synchronize()?;
        Tensor::new(&t.shape, data)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        if w.shape.len() != 2 || x.cols() != w.shape[0] {
            return Err(shape_err(
                "matmul",
                format!("{:?} @ {:?}", x.shape, w.shape),
            ));
        }
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("x has a dim") = w.cols();
        let mut out = self.zeros(&shape)?;
        blas::matmul(&self.blas, x, w, &mut out)?;
        Ok(out)
    }

    fn matmul_nt(&self, dy: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        if w.shape.len() != 2 || dy.cols() != w.cols() {
            return Err(shape_err(
                "matmul_nt",
                format!("{:?} @ {:?}^T", dy.shape, w.shape),
            ));
        }
        let mut shape = dy.shape.clone();
        *shape.last_mut().expect("dy has a dim") = w.shape[0];
        let mut out = self.zeros(&shape)?;
        blas::matmul_nt(&self.blas, dy, w, &mut out)?;
        Ok(out)
    }

    fn matmul_tn_acc(&self, x: &CudaTensor, dy: &CudaTensor, acc: &mut CudaTensor) -> Result<()> {
        if x.rows() != dy.rows() || acc.shape != [x.cols(), dy.cols()] {
            return Err(shape_err(
                "matmul_tn_acc",
                format!("{:?}^T @ {:?} into {:?}", x.shape, dy.shape, acc.shape),
            ));
        }
        blas::matmul_tn_acc(&self.blas, x, dy, acc)
    }

    fn add_bias(&self, x: &mut CudaTensor, b: &CudaTensor) -> Result<()> {
        bias_shape("add_bias", x, b)?;
        self.kernels.add_bias(&self.stream, x, b)
    }

    fn bias_grad_acc(&self, dy: &CudaTensor, acc: &mut CudaTensor) -> Result<()> {
        bias_shape("bias_grad_acc", dy, acc)?;
        self.kernels.bias_grad_acc(&self.stream, dy, acc)
    }

    fn gelu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let mut out = self.zeros(&x.shape)?;
        self.kernels.gelu(&self.stream, x, &mut out)?;
        Ok(out)
    }

    fn gelu_backward(&self, x: &CudaTensor, dy: &CudaTensor) -> Result<CudaTensor> {
        same_shape("gelu_backward", x, dy)?;
        let mut out = self.zeros(&x.shape)?;
        self.kernels.gelu_backward(&self.stream, x, dy, &mut out)?;
        Ok(out)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        same_shape("add", a, b)?;
        let mut out = self.zeros(&a.shape)?;
        self.kernels.add(&self.stream, a, b, &mut out)?;
        Ok(out)
    }
}
