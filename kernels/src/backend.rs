//! A device-generic face over the ops that both backends implement, so one
//! test (or one caller) can run on the CPU and, with feature `cuda`, a GPU.
//!
//! [`Cpu`] is the host backend; `cuda::CudaBackend` the GPU one. Copies
//! between host and device are explicit ([`Backend::upload`],
//! [`Backend::download`]); nothing moves implicitly.

use crate::cpu::rotary::Turn;
use crate::cpu::{self, AttnShape, GluKind};
use crate::error::{shape_err, Result};
use crate::footprint::Footprint;
use crate::kept::{HostKept, HostNormStash, Restored};
use crate::optim::{adamw_update, AdamWUpdate};
use crate::precision::Precision;
use crate::tensor::Tensor;

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
pub(crate) fn check_range(op: &'static str, offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(shape_err(
            op,
            format!("{len} elements at offset {offset} of {total}"),
        )),
    }
}

/// Ops with the semantics of their [`cpu`] namesakes, on a device's storage.
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
    /// moments `m`, `v` (all the same shape), as [`crate::optim::AdamW`].
    fn adamw_step(
        &self,
        x: &mut Self::Storage,
        g: &Self::Storage,
        m: &mut Self::Storage,
        v: &mut Self::Storage,
        h: &AdamWUpdate,
    ) -> Result<()>;
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
    /// See [`cpu::glu`]: `act(gate) * up` of a fused `[.., 2f]` pre-activation.
    fn glu(&self, h: &Self::Storage, kind: GluKind) -> Result<Self::Storage>;
    /// See [`cpu::glu_backward`].
    fn glu_backward(
        &self,
        h: &Self::Storage,
        da: &Self::Storage,
        kind: GluKind,
    ) -> Result<Self::Storage>;
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
    /// See [`cpu::rms_norm`]; the stash has LayerNorm's form (`x̂`, `1/rms` per row).
    fn rms_norm(
        &self,
        x: &Self::Storage,
        gamma: &Self::Storage,
        eps: f32,
    ) -> Result<(Self::Storage, Self::NormStash)>;
    /// See [`cpu::rms_norm_backward_input_from`].
    fn rms_norm_backward_input(
        &self,
        dy: &Self::Storage,
        gamma: &Self::Storage,
        stash: &Self::NormStash,
    ) -> Result<Self::Storage>;
    /// See [`cpu::rms_norm_backward_weight`] (which takes the stash's `xhat`).
    fn rms_norm_backward_weight(
        &self,
        dy: &Self::Storage,
        stash: &Self::NormStash,
        dgamma: &mut Self::Storage,
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
    /// See [`cpu::embedding`] (token plus, where there is a table, positional embedding).
    fn embedding(
        &self,
        ids: &[u32],
        seq: usize,
        wte: &Self::Storage,
        wpe: Option<&Self::Storage>,
    ) -> Result<Self::Storage>;
    /// See [`cpu::embedding_backward_weight`].
    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &Self::Storage,
        dwte: &mut Self::Storage,
        dwpe: Option<&mut Self::Storage>,
    ) -> Result<()>;
    /// See [`cpu::rotary::rotate`]: turns the query and key heads of a fused `qkv` in place
    /// by their positions' angles (`table` from [`cpu::rotary_table`], uploaded), or back
    /// by them (the backward, on a gradient).
    fn rotary(
        &self,
        qkv: &mut Self::Storage,
        table: &Self::Storage,
        sh: AttnShape,
        dir: Turn,
    ) -> Result<()>;
    /// See [`cpu::causal_attention`]: the output and what the backward needs.
    fn causal_attention(
        &self,
        qkv: &Self::Storage,
        sh: AttnShape,
    ) -> Result<(Self::Storage, Self::AttnStash)>;
    /// See [`cpu::causal_attention_backward`]: the gradient of the fused qkv
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

/// The host backend: storage is a [`Tensor`], ops are [`cpu`]'s. In a reduced
/// [`Precision`] it emulates the GPU: matmul inputs are rounded (RNE) to bf16 or TF32 and
/// accumulated in f32, stored activations rounded to bf16; in f32 nothing is rounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    precision: Precision,
}

/// The f32 host backend, as a value: `Cpu` was a unit struct before it had a precision, and
/// this keeps every `Arc::new(Cpu)` meaning what it meant.
#[allow(non_upper_case_globals)]
pub const Cpu: Cpu = Cpu::new(Precision::F32);

impl Cpu {
    /// The host backend computing in `precision`.
    pub const fn new(precision: Precision) -> Self {
        Cpu { precision }
    }

    /// A norm's output and its stash as the backend keeps it (`x̂` in the activation format).
    fn keep_norm(&self, (y, s): (Tensor, cpu::LayerNormStash)) -> Result<(Tensor, HostNormStash)> {
        let stash = HostNormStash {
            xhat: self.keep(s.xhat)?,
            rstd: s.rstd,
        };
        Ok((y, stash))
    }

    /// Copies of `a` and `b` rounded to what a matmul reads, or `None` in f32 (so f32
    /// matmuls run on the tensors themselves, bit-identical to before precisions existed).
    fn rounded(&self, a: &Tensor, b: &Tensor) -> Option<(Tensor, Tensor)> {
        if self.precision == Precision::F32 {
            return None;
        }
        let round = |t: &Tensor| {
            let mut t = t.clone();
            self.precision.round_matmul_input(t.data_mut());
            t
        };
        Some((round(a), round(b)))
    }
}

impl Backend for Cpu {
    type Storage = Tensor;
    type NormStash = HostNormStash;
    /// The attention probabilities, in f32 in every precision: they stand in for what a GPU
    /// backward recomputes in f32 from the logsumexp, so a bf16 run on the CPU reads the
    /// values a GPU's does (narrowing them would make the two runs part ways).
    type AttnStash = Tensor;
    type Kept = HostKept;

    fn name(&self) -> String {
        "cpu".into()
    }
    fn precision(&self) -> Precision {
        self.precision
    }
    fn round_activation(&self, t: &mut Tensor) -> Result<()> {
        self.precision.round_activation(t.data_mut());
        Ok(())
    }
    fn keep(&self, t: Tensor) -> Result<HostKept> {
        Ok(HostKept::new(t, self.precision))
    }
    fn restore<'a>(&self, k: &'a HostKept) -> Result<Restored<'a, Tensor>> {
        k.restore()
    }
    fn restore_owned(&self, k: HostKept) -> Result<Tensor> {
        k.into_tensor()
    }
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn download(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::zeros(shape))
    }
    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn add_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        a.add_assign(b)
    }
    fn scale(&self, t: &mut Tensor, s: f32) -> Result<()> {
        t.scale(s);
        Ok(())
    }
    fn fill_zero(&self, t: &mut Tensor) -> Result<()> {
        t.fill_zero();
        Ok(())
    }
    fn copy_to_offset(&self, src: &Tensor, dst: &mut Tensor, offset: usize) -> Result<()> {
        let n = src.numel();
        check_range("copy_to_offset", offset, n, dst.numel())?;
        dst.data_mut()[offset..offset + n].copy_from_slice(src.data());
        Ok(())
    }
    fn copy_from_offset(&self, src: &Tensor, offset: usize, dst: &mut Tensor) -> Result<()> {
        let n = dst.numel();
        check_range("copy_from_offset", offset, n, src.numel())?;
        dst.data_mut()
            .copy_from_slice(&src.data()[offset..offset + n]);
        Ok(())
    }
    fn adamw_step(
        &self,
        x: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        h: &AdamWUpdate,
    ) -> Result<()> {
        x.check_same("adamw_step", g)?;
        x.check_same("adamw_step", m)?;
        x.check_same("adamw_step", v)?;
        adamw_update(x.data_mut(), g.data(), m.data_mut(), v.data_mut(), h);
        Ok(())
    }
    fn matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        match self.rounded(x, w) {
            Some((x, w)) => cpu::matmul(&x, &w),
            None => cpu::matmul(x, w),
        }
    }
    fn matmul_nt(&self, dy: &Tensor, w: &Tensor) -> Result<Tensor> {
        match self.rounded(dy, w) {
            Some((dy, w)) => cpu::matmul_nt(&dy, &w),
            None => cpu::matmul_nt(dy, w),
        }
    }
    fn matmul_tn_acc(&self, x: &Tensor, dy: &Tensor, acc: &mut Tensor) -> Result<()> {
        // The accumulator (a weight gradient) stays f32 in every precision.
        match self.rounded(x, dy) {
            Some((x, dy)) => cpu::matmul_tn_acc(&x, &dy, acc),
            None => cpu::matmul_tn_acc(x, dy, acc),
        }
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
    fn glu(&self, h: &Tensor, kind: GluKind) -> Result<Tensor> {
        cpu::glu(h, kind)
    }
    fn glu_backward(&self, h: &Tensor, da: &Tensor, kind: GluKind) -> Result<Tensor> {
        cpu::glu_backward(h, da, kind)
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
    ) -> Result<(Tensor, HostNormStash)> {
        self.keep_norm(cpu::layer_norm(x, gamma, beta, eps)?)
    }
    fn layer_norm_backward_input(
        &self,
        dy: &Tensor,
        gamma: &Tensor,
        stash: &HostNormStash,
    ) -> Result<Tensor> {
        let xhat = stash.xhat.restore()?;
        cpu::layer_norm_backward_input_from(dy, gamma, &xhat, &stash.rstd)
    }
    fn layer_norm_backward_weight(
        &self,
        dy: &Tensor,
        stash: &HostNormStash,
        dgamma: &mut Tensor,
        dbeta: &mut Tensor,
    ) -> Result<()> {
        cpu::layer_norm_backward_weight(dy, &*stash.xhat.restore()?, dgamma, dbeta)
    }
    fn rms_norm(&self, x: &Tensor, gamma: &Tensor, eps: f32) -> Result<(Tensor, HostNormStash)> {
        self.keep_norm(cpu::rms_norm(x, gamma, eps)?)
    }
    fn rms_norm_backward_input(
        &self,
        dy: &Tensor,
        gamma: &Tensor,
        stash: &HostNormStash,
    ) -> Result<Tensor> {
        let xhat = stash.xhat.restore()?;
        cpu::rms_norm_backward_input_from(dy, gamma, &xhat, &stash.rstd)
    }
    fn rms_norm_backward_weight(
        &self,
        dy: &Tensor,
        stash: &HostNormStash,
        dgamma: &mut Tensor,
    ) -> Result<()> {
        cpu::rms_norm_backward_weight(dy, &*stash.xhat.restore()?, dgamma)
    }
    fn cross_entropy(&self, logits: &Tensor, targets: &[u32], scale: f32) -> Result<(f32, Tensor)> {
        cpu::cross_entropy(logits, targets, scale)
    }
    fn cross_entropy_backward(&self, probs: Tensor, targets: &[u32], scale: f32) -> Result<Tensor> {
        cpu::cross_entropy_backward(probs, targets, scale)
    }
    fn embedding(
        &self,
        ids: &[u32],
        seq: usize,
        wte: &Tensor,
        wpe: Option<&Tensor>,
    ) -> Result<Tensor> {
        cpu::embedding(ids, seq, wte, wpe)
    }
    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &Tensor,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
    ) -> Result<()> {
        cpu::embedding_backward_weight(ids, seq, dy, dwte, dwpe)
    }
    fn rotary(&self, qkv: &mut Tensor, table: &Tensor, sh: AttnShape, dir: Turn) -> Result<()> {
        cpu::rotary::rotate(qkv, table, sh, dir)
    }
    fn causal_attention(&self, qkv: &Tensor, sh: AttnShape) -> Result<(Tensor, Tensor)> {
        cpu::causal_attention(qkv, sh)
    }
    fn causal_attention_backward(
        &self,
        qkv: &Tensor,
        _out: &Tensor,
        probs: &Tensor,
        dout: &Tensor,
        sh: AttnShape,
    ) -> Result<Tensor> {
        cpu::causal_attention_backward(qkv, probs, dout, sh)
    }
}
