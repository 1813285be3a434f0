//! A device-generic face over the ops that both backends implement, so one
//! test (or one caller) can run on the CPU and, with feature `cuda`, a GPU.
//!
//! [`Cpu`] is the host backend; `cuda::CudaBackend` the GPU one. Copies
//! between host and device are explicit ([`Backend::upload`],
//! [`Backend::download`]); nothing moves implicitly.

use crate::cpu::{self, AttnShape};
use crate::error::Result;
use crate::tensor::Tensor;

/// Ops with the semantics of their [`cpu`] namesakes, on a device's storage.
pub trait Backend {
    /// A tensor living on this backend.
    type Storage;
    /// What a LayerNorm forward saves for its backward (normalised input and
    /// per-row reciprocal standard deviation), kept on the device.
    type NormStash;

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
    /// See [`cpu::add`]; also the residual add.
    fn add(&self, a: &Self::Storage, b: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::layer_norm`].
    fn layer_norm(
        &self,
        x: &Self::Storage,
        gamma: &Self::Storage,
        beta: &Self::Storage,
        eps: f32,
    ) -> Result<(Self::Storage, Self::NormStash)>;
    /// See [`cpu::layer_norm_backward_input`].
    fn layer_norm_backward_input(
        &self,
        dy: &Self::Storage,
        gamma: &Self::Storage,
        stash: &Self::NormStash,
    ) -> Result<Self::Storage>;
    /// See [`cpu::layer_norm_backward_weight`] (which takes the stash's `xhat`).
    fn layer_norm_backward_weight(
        &self,
        dy: &Self::Storage,
        stash: &Self::NormStash,
        dgamma: &mut Self::Storage,
        dbeta: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::cross_entropy`]: the scaled mean loss (on the host, since
    /// every caller needs it there) and the softmax probabilities.
    fn cross_entropy(
        &self,
        logits: &Self::Storage,
        targets: &[u32],
        scale: f32,
    ) -> Result<(f32, Self::Storage)>;
    /// See [`cpu::cross_entropy_backward`]; reuses `probs` for the gradient.
    fn cross_entropy_backward(
        &self,
        probs: Self::Storage,
        targets: &[u32],
        scale: f32,
    ) -> Result<Self::Storage>;
    /// See [`cpu::embedding`] (token plus positional embedding).
    fn embedding(
        &self,
        ids: &[u32],
        seq: usize,
        wte: &Self::Storage,
        wpe: &Self::Storage,
    ) -> Result<Self::Storage>;
    /// See [`cpu::embedding_backward_weight`].
    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &Self::Storage,
        dwte: &mut Self::Storage,
        dwpe: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::causal_attention`]: output and attention probabilities.
    fn causal_attention(
        &self,
        qkv: &Self::Storage,
        sh: AttnShape,
    ) -> Result<(Self::Storage, Self::Storage)>;
    /// See [`cpu::causal_attention_backward`]: the gradient of the fused qkv.
    fn causal_attention_backward(
        &self,
        qkv: &Self::Storage,
        probs: &Self::Storage,
        dout: &Self::Storage,
        sh: AttnShape,
    ) -> Result<Self::Storage>;
}

/// The host backend: storage is a [`Tensor`], ops are [`cpu`]'s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Storage = Tensor;
    type NormStash = cpu::LayerNormStash;

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
    fn layer_norm(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, cpu::LayerNormStash)> {
        cpu::layer_norm(x, gamma, beta, eps)
    }
    fn layer_norm_backward_input(
        &self,
        dy: &Tensor,
        gamma: &Tensor,
        stash: &cpu::LayerNormStash,
    ) -> Result<Tensor> {
        cpu::layer_norm_backward_input(dy, gamma, stash)
    }
    fn layer_norm_backward_weight(
        &self,
        dy: &Tensor,
        stash: &cpu::LayerNormStash,
        dgamma: &mut Tensor,
        dbeta: &mut Tensor,
    ) -> Result<()> {
        cpu::layer_norm_backward_weight(dy, &stash.xhat, dgamma, dbeta)
    }
    fn cross_entropy(&self, logits: &Tensor, targets: &[u32], scale: f32) -> Result<(f32, Tensor)> {
        cpu::cross_entropy(logits, targets, scale)
    }
    fn cross_entropy_backward(&self, probs: Tensor, targets: &[u32], scale: f32) -> Result<Tensor> {
        cpu::cross_entropy_backward(probs, targets, scale)
    }
    fn embedding(&self, ids: &[u32], seq: usize, wte: &Tensor, wpe: &Tensor) -> Result<Tensor> {
        cpu::embedding(ids, seq, wte, wpe)
    }
    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &Tensor,
        dwte: &mut Tensor,
        dwpe: &mut Tensor,
    ) -> Result<()> {
        cpu::embedding_backward_weight(ids, seq, dy, dwte, dwpe)
    }
    fn causal_attention(&self, qkv: &Tensor, sh: AttnShape) -> Result<(Tensor, Tensor)> {
        cpu::causal_attention(qkv, sh)
    }
    fn causal_attention_backward(
        &self,
        qkv: &Tensor,
        probs: &Tensor,
        dout: &Tensor,
        sh: AttnShape,
    ) -> Result<Tensor> {
        cpu::causal_attention_backward(qkv, probs, dout, sh)
    }
}
