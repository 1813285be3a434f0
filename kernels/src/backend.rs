//! A device-generic face over the ops that both backends implement, so one
//! test (or one caller) can run on the CPU and, with feature `cuda`, a GPU.
//!
//! [`Cpu`] is the host backend; `cuda::CudaBackend` the GPU one. Copies
//! between host and device are explicit ([`Backend::upload`],
//! [`Backend::download`]); nothing moves implicitly.

use crate::cpu;
use crate::error::Result;
use crate::tensor::Tensor;

/// Ops with the semantics of their [`cpu`] namesakes, on a device's storage.
pub trait Backend {
    /// A tensor living on this backend.
    type Storage;

    /// Short name for messages (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;
    /// Copies a host tensor to the device.
    fn upload(&self, t: &Tensor) -> Result<Self::Storage>;
    /// Copies a device tensor to the host (waits for pending work).
    fn download(&self, t: &Self::Storage) -> Result<Tensor>;
    /// See [`cpu::matmul`].
    fn matmul(&self, x: &Self::Storage, w: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::matmul_nt`].
    fn matmul_nt(&self, dy: &Self::Storage, w: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::matmul_tn_acc`].
    fn matmul_tn_acc(
        &self,
        x: &Self::Storage,
        dy: &Self::Storage,
        acc: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::add_bias`].
    fn add_bias(&self, x: &mut Self::Storage, b: &Self::Storage) -> Result<()>;
    /// See [`cpu::bias_grad_acc`].
    fn bias_grad_acc(&self, dy: &Self::Storage, acc: &mut Self::Storage) -> Result<()>;
    /// See [`cpu::gelu`].
    fn gelu(&self, x: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::gelu_backward`].
    fn gelu_backward(&self, x: &Self::Storage, dy: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::add`].
    fn add(&self, a: &Self::Storage, b: &Self::Storage) -> Result<Self::Storage>;
}

/// The host backend: storage is a [`Tensor`], ops are [`cpu`]'s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Storage = Tensor;

    fn name(&self) -> String {
        "cpu".into()
    }
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn download(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        cpu::matmul(x, w)
    }
    fn matmul_nt(&self, dy: &Tensor, w: &Tensor) -> Result<Tensor> {
        cpu::matmul_nt(dy, w)
    }
    fn matmul_tn_acc(&self, x: &Tensor, dy: &Tensor, acc: &mut Tensor) -> Result<()> {
        cpu::matmul_tn_acc(x, dy, acc)
    }
    fn add_bias(&self, x: &mut Tensor, b: &Tensor) -> Result<()> {
        cpu::add_bias(x, b)
    }
    fn bias_grad_acc(&self, dy: &Tensor, acc: &mut Tensor) -> Result<()> {
        cpu::bias_grad_acc(dy, acc)
    }
    fn gelu(&self, x: &Tensor) -> Result<Tensor> {
        Ok(cpu::gelu(x))
    }
    fn gelu_backward(&self, x: &Tensor, dy: &Tensor) -> Result<Tensor> {
        cpu::gelu_backward(x, dy)
    }
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        cpu::add(a, b)
    }
}
