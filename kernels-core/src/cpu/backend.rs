//! The host backend ([`Cpu`]): the [`Backend`] ops on host [`Tensor`]s, run by this
//! folder's functions.

use super::adamw::adamw_update;
use super::rotary::Turn;
use super::{AttnShape, GluKind};
use crate::backend::{check_range, AdamWUpdate, Backend, Restored};
use crate::cpu;
use crate::error::Result;
use crate::kept::{HostKept, HostNormStash};
use crate::precision::{Precision, PrecisionExt};
use crate::tensor::Tensor;

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
