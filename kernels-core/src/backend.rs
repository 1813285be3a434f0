//! A device-generic face over the ops that both backends implement, so one
//! test (or one caller) can run on the CPU and, with feature `cuda`, a GPU.
//!
//! [`Cpu`](struct@crate::Cpu) is the host backend (`cpu/`); `CudaBackend` the GPU one
//! (crate `pipewright-kernels-cuda`),
//! each in its own folder with its own AdamW update. This file knows neither. Copies
//! between host and device are explicit ([`Backend::upload`],
//! [`Backend::download`]); nothing moves implicitly.

use crate::cpu::rotary::Turn;
use crate::cpu::{AttnShape, GluKind};
use crate::error::{shape_err, Result};
use crate::footprint::Footprint;
use crate::precision::Precision;
use crate::tensor::Tensor;
use std::ops::Deref;

/// What any backend's tensor tells without touching its data, so shapes
/// can be checked and parameters counted without a backend at hand.
pub trait Shaped {
    /// The dimensions.
    fn shape(&self) -> &[usize];
    /// Number of elements.
    fn numel(&self) -> usize {
        self.shape().iter().product()
    }
}

impl Shaped for Tensor {
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
}

/// Errors unless `offset + len` fits in `total` (for the offset copies).
pub fn check_range(op: &'static str, offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(shape_err(
            op,
            format!("{len} elements at offset {offset} of {total}"),
        )),
    }
}

/// Ops with the semantics of their [`cpu`](crate::cpu) namesakes, on a device's storage.
pub trait Backend {
    /// A tensor living on this backend.
    type Storage: Shaped + Footprint + std::fmt::Debug;
    /// What a LayerNorm forward saves for its backward (normalised input and
    /// per-row reciprocal standard deviation), kept on the device.
    type NormStash: Footprint + std::fmt::Debug;
    /// What a causal attention forward saves for its backward besides its
    /// input and output: the probabilities on the CPU (`[batch, heads, seq, seq]`),
    /// the per-row logsumexp on a GPU (`[batch, heads, seq]`, recomputing the
    /// probabilities tile by tile in the backward).
    type AttnStash: Footprint + std::fmt::Debug;
    /// An activation as a stash keeps it from a forward until its backward
    /// ([`crate::kept`]): the tensor itself in f32 and tf32 runs, 2 bytes an element in a
    /// bf16 run.
    type Kept: Shaped + Footprint + std::fmt::Debug;

    /// Short name for messages (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;
    /// What the matmuls read and what stored activations are ([`Precision`]); master
    /// weights, gradients and optimizer state are f32 whatever it is.
    fn precision(&self) -> Precision;
    /// Rounds `t` in place to the stored-activation format of [`Self::precision`] (bf16 in
    /// a bf16 run; nothing otherwise): the residual stream between blocks, so every
    /// pipeline hand-off carries values a bf16 wire holds exactly.
    fn round_activation(&self, t: &mut Self::Storage) -> Result<()>;
    /// `t` as a stash keeps it, in [`Self::precision`]'s activation format (moved, not
    /// copied, where that is f32).
    fn keep(&self, t: Self::Storage) -> Result<Self::Kept>;
    /// A kept tensor's values as f32 storage: lent where it is kept in f32, else widened.
    fn restore<'a>(&self, k: &'a Self::Kept) -> Result<Restored<'a, Self::Storage>>;
    /// [`Self::restore`] by value: the stored tensor itself where it is kept in f32.
    fn restore_owned(&self, k: Self::Kept) -> Result<Self::Storage>;
    /// The device's free and total bytes as its driver reports them (`cuMemGetInfo` on a
    /// GPU: every process and allocator cache on it counts), `None` where tensors live in
    /// host memory.
    fn device_memory(&self) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }
    /// Copies a host tensor to the device.
    fn upload(&self, t: &Tensor) -> Result<Self::Storage>;
    /// Copies a device tensor to the host (waits for pending work).
    fn download(&self, t: &Self::Storage) -> Result<Tensor>;
    /// A tensor of zeros on the device.
    fn zeros(&self, shape: &[usize]) -> Result<Self::Storage>;
    /// A copy on the device (device tensors need not be `Clone`).
    fn copy(&self, t: &Self::Storage) -> Result<Self::Storage>;
    /// `a += b`, elementwise (the residual add in place).
    fn add_assign(&self, a: &mut Self::Storage, b: &Self::Storage) -> Result<()>;
    /// Multiplies every element by `s`.
    fn scale(&self, t: &mut Self::Storage, s: f32) -> Result<()>;
    /// Sets every element to zero, keeping the allocation.
    fn fill_zero(&self, t: &mut Self::Storage) -> Result<()>;
    /// Writes all of `src` into `dst`'s elements `offset..offset + src.numel()`
    /// (row-major, shapes ignored): how parameters are packed into one flat tensor.
    fn copy_to_offset(
        &self,
        src: &Self::Storage,
        dst: &mut Self::Storage,
        offset: usize,
    ) -> Result<()>;
    /// Fills all of `dst` from `src`'s elements `offset..offset + dst.numel()`:
    /// how a flat tensor is unpacked into parameters.
    fn copy_from_offset(
        &self,
        src: &Self::Storage,
        offset: usize,
        dst: &mut Self::Storage,
    ) -> Result<()>;
    /// One AdamW update of one parameter tensor `x` with gradient `g` and
    /// moments `m`, `v` (all the same shape), as `pipewright_kernels::optim::AdamW`.
    fn adamw_step(
        &self,
        x: &mut Self::Storage,
        g: &Self::Storage,
        m: &mut Self::Storage,
        v: &mut Self::Storage,
        h: &AdamWUpdate,
    ) -> Result<()>;
    /// See [`cpu::matmul`](crate::cpu::matmul).
    fn matmul(&self, x: &Self::Storage, w: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::matmul_nt`](crate::cpu::matmul_nt).
    fn matmul_nt(&self, dy: &Self::Storage, w: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::matmul_tn_acc`](crate::cpu::matmul_tn_acc).
    fn matmul_tn_acc(
        &self,
        x: &Self::Storage,
        dy: &Self::Storage,
        acc: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::add_bias`](crate::cpu::add_bias).
    fn add_bias(&self, x: &mut Self::Storage, b: &Self::Storage) -> Result<()>;
    /// See [`cpu::bias_grad_acc`](crate::cpu::bias_grad_acc).
    fn bias_grad_acc(&self, dy: &Self::Storage, acc: &mut Self::Storage) -> Result<()>;
    /// See [`cpu::gelu`](crate::cpu::gelu).
    fn gelu(&self, x: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::gelu_backward`](crate::cpu::gelu_backward).
    fn gelu_backward(&self, x: &Self::Storage, dy: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::glu`](fn@crate::cpu::glu): `act(gate) * up` of a fused `[.., 2f]` pre-activation.
    fn glu(&self, h: &Self::Storage, kind: GluKind) -> Result<Self::Storage>;
    /// See [`cpu::glu_backward`](crate::cpu::glu_backward).
    fn glu_backward(
        &self,
        h: &Self::Storage,
        da: &Self::Storage,
        kind: GluKind,
    ) -> Result<Self::Storage>;
    /// See [`cpu::add`](crate::cpu::add); also the residual add.
    fn add(&self, a: &Self::Storage, b: &Self::Storage) -> Result<Self::Storage>;
    /// See [`cpu::layer_norm`](crate::cpu::layer_norm).
    fn layer_norm(
        &self,
        x: &Self::Storage,
        gamma: &Self::Storage,
        beta: &Self::Storage,
        eps: f32,
    ) -> Result<(Self::Storage, Self::NormStash)>;
    /// See [`cpu::layer_norm_backward_input`](crate::cpu::layer_norm_backward_input).
    fn layer_norm_backward_input(
        &self,
        dy: &Self::Storage,
        gamma: &Self::Storage,
        stash: &Self::NormStash,
    ) -> Result<Self::Storage>;
    /// See [`cpu::layer_norm_backward_weight`](crate::cpu::layer_norm_backward_weight) (which takes
    /// the stash's `xhat`).
    fn layer_norm_backward_weight(
        &self,
        dy: &Self::Storage,
        stash: &Self::NormStash,
        dgamma: &mut Self::Storage,
        dbeta: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::rms_norm`](crate::cpu::rms_norm); the stash has LayerNorm's form (`x̂`, `1/rms`
    /// per row).
    fn rms_norm(
        &self,
        x: &Self::Storage,
        gamma: &Self::Storage,
        eps: f32,
    ) -> Result<(Self::Storage, Self::NormStash)>;
    /// See [`cpu::rms_norm_backward_input_from`](crate::cpu::rms_norm_backward_input_from).
    fn rms_norm_backward_input(
        &self,
        dy: &Self::Storage,
        gamma: &Self::Storage,
        stash: &Self::NormStash,
    ) -> Result<Self::Storage>;
    /// See [`cpu::rms_norm_backward_weight`](crate::cpu::rms_norm_backward_weight) (which takes the
    /// stash's `xhat`).
    fn rms_norm_backward_weight(
        &self,
        dy: &Self::Storage,
        stash: &Self::NormStash,
        dgamma: &mut Self::Storage,
    ) -> Result<()>;
    /// See [`cpu::cross_entropy`](crate::cpu::cross_entropy): the scaled mean loss (on the host,
    /// since
    /// every caller needs it there) and the softmax probabilities.
    fn cross_entropy(
        &self,
        logits: &Self::Storage,
        targets: &[u32],
        scale: f32,
    ) -> Result<(f32, Self::Storage)>;
    /// See [`cpu::cross_entropy_backward`](crate::cpu::cross_entropy_backward); reuses `probs` for
    /// the gradient.
    fn cross_entropy_backward(
        &self,
        probs: Self::Storage,
        targets: &[u32],
        scale: f32,
    ) -> Result<Self::Storage>;
    /// See [`cpu::embedding`](fn@crate::cpu::embedding) (token plus, where there is a table,
    /// positional embedding).
    fn embedding(
        &self,
        ids: &[u32],
        seq: usize,
        wte: &Self::Storage,
        wpe: Option<&Self::Storage>,
    ) -> Result<Self::Storage>;
    /// See [`cpu::embedding_backward_weight`](crate::cpu::embedding_backward_weight).
    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &Self::Storage,
        dwte: &mut Self::Storage,
        dwpe: Option<&mut Self::Storage>,
    ) -> Result<()>;
    /// See [`cpu::rotary::rotate`](crate::cpu::rotary::rotate): turns the query and key heads of a
    /// fused `qkv` in place
    /// by their positions' angles (`table` from [`cpu::rotary_table`](crate::cpu::rotary_table),
    /// uploaded), or back
    /// by them (the backward, on a gradient).
    fn rotary(
        &self,
        qkv: &mut Self::Storage,
        table: &Self::Storage,
        sh: AttnShape,
        dir: Turn,
    ) -> Result<()>;
    /// See [`cpu::causal_attention`](crate::cpu::causal_attention): the output and what the
    /// backward needs.
    fn causal_attention(
        &self,
        qkv: &Self::Storage,
        sh: AttnShape,
    ) -> Result<(Self::Storage, Self::AttnStash)>;
    /// See [`cpu::causal_attention_backward`](crate::cpu::causal_attention_backward): the gradient
    /// of the fused qkv
    /// from the forward's input `qkv`, its output `out` and its stash.
    fn causal_attention_backward(
        &self,
        qkv: &Self::Storage,
        out: &Self::Storage,
        stash: &Self::AttnStash,
        dout: &Self::Storage,
        sh: AttnShape,
    ) -> Result<Self::Storage>;
}

/// A kept tensor as the backward reads it: the stored tensor itself where nothing was
/// narrowed (no copy), or a widened f32 copy.
#[derive(Debug)]
pub enum Restored<'a, S> {
    /// The tensor the stash holds, lent.
    Same(&'a S),
    /// A widened copy, owned.
    Widened(S),
}

impl<S> Deref for Restored<'_, S> {
    type Target = S;
    fn deref(&self) -> &S {
        match self {
            Restored::Same(s) => s,
            Restored::Widened(s) => s,
        }
    }
}

/// The scalars of one AdamW update of one parameter tensor: what a
/// backend's [`Backend::adamw_step`] needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWUpdate {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// `1 - lr * weight_decay` for decayed parameters, else 1.
    pub shrink: f32,
    /// Bias correction of the first moment, `1 - beta1^t`.
    pub bc1: f32,
    /// Bias correction of the second moment, `1 - beta2^t`.
    pub bc2: f32,
}
