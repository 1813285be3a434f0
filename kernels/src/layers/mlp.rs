//! The MLP: column-parallel `fc1`, an activation, row-parallel `fc2`. Either
//! GPT-2's (`fc1` of width `d_ff`, GeLU, biases) or gated (Shazeer 2020, as in
//! Llama: `fc1` the gate and up projections of width `d_ff` each, fused into
//! one `[d, 2 * d_ff]` weight, `act(gate) * up` with SiLU (SwiGLU) or GeLU
//! (GeGLU), then `fc2` the down projection; no biases).
//!
//! With `tp` ranks each holds `d_ff / tp` hidden units (of the gate and of
//! the up projection alike: the fused weight is split as two column
//! segments, so a rank's gate and up columns are the same units); the hidden
//! layer never crosses ranks. Forward needs one all-reduce (after `fc2`), the
//! input backward one (of the gradient reaching `fc1`'s input).

use super::linear::{ColumnParallelLinear, RowParallelLinear};
use super::shard::TpShard;
use super::{cpu_backend, seq, Parameters, TpReduce};
use crate::backend::Backend;
use crate::cpu::Cpu;
use crate::cpu::GluKind;
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Arc;

/// The MLP's form: GPT-2's GeLU MLP (`fc1`, GeLU, `fc2`, with biases), or gated by SiLU
/// (Llama, Mistral, Qwen) or GeLU (Gemma). Defined once in `pipewright-kinds`; what it means
/// to the layers is [`MlpKindExt`].
pub use pipewright_kinds::MlpKind;

/// What an [`MlpKind`] means to the layers (kernel-only, so not in `pipewright-kinds`).
pub trait MlpKindExt {
    /// The gate's activation, or `None` for the plain GeLU MLP.
    fn glu(self) -> Option<GluKind>;
    /// Columns of `fc1` per hidden unit: 2 (gate and up) when gated.
    fn fc1_width(self) -> usize;
}

impl MlpKindExt for MlpKind {
    fn glu(self) -> Option<GluKind> {
        match self {
            MlpKind::Gelu => None,
            MlpKind::SwiGlu => Some(GluKind::SwiGlu),
            MlpKind::GeGlu => Some(GluKind::GeGlu),
        }
    }

    fn fc1_width(self) -> usize {
        if self.glu().is_some() {
            2
        } else {
            1
        }
    }
}

/// A TP rank's shard of the MLP (the whole MLP when `tp = 1`).
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, fc1.local, fc2.local)]
pub struct Mlp<B: Backend = Cpu> {
    /// `[d, d_ff / tp]`, or gated `[d, 2 * d_ff / tp]` (this rank's gate
    /// columns, then its up columns).
    pub fc1: ColumnParallelLinear<B>,
    /// `[d_ff / tp, d]`, full bias (none when gated).
    pub fc2: RowParallelLinear<B>,
    kind: MlpKind,
}

super::clone_if_tensors_clone!(Mlp { fc1, fc2, kind });

/// What the MLP's input backward needs, kept in the backend's activation format.
#[derive(Debug)]
pub struct MlpStash<B: Backend = Cpu> {
    x: B::Kept,
    h: B::Kept,
    a: B::Kept,
}

super::clone_if_tensors_clone!(MlpStash { x, h, a });
super::footprint_of!(MlpStash { x, h, a });

/// What the MLP's weight backward needs.
#[derive(Debug)]
pub struct MlpWeightStash<B: Backend = Cpu> {
    x: B::Kept,
    dh: B::Kept,
    a: B::Kept,
    dy: B::Kept,
}

super::clone_if_tensors_clone!(MlpWeightStash { x, dh, a, dy });
super::footprint_of!(MlpWeightStash { x, dh, a, dy });

impl Mlp {
    /// This rank's shard of the MLP with full weights `w1 [d, d_ff]`,
    /// `b1 [d_ff]`, `w2 [d_ff, d]`, `b2 [d]`.
    pub fn from_full(
        name: &str,
        w1: &Tensor,
        b1: &Tensor,
        w2: &Tensor,
        b2: &Tensor,
        tp: TpShard,
    ) -> Result<Self> {
        Self::from_full_on(&cpu_backend(), name, w1, b1, w2, b2, tp)
    }
}

impl<B: Backend> Mlp<B> {
    /// [`Mlp::from_full`], with the shard uploaded to `be`.
    pub fn from_full_on(
        be: &Arc<B>,
        name: &str,
        w1: &Tensor,
        b1: &Tensor,
        w2: &Tensor,
        b2: &Tensor,
        tp: TpShard,
    ) -> Result<Self> {
        Self::from_fused_on(be, name, MlpKind::Gelu, (w1, Some(b1)), (w2, Some(b2)), tp)
    }

    /// This rank's shard of an MLP of `kind` with full weights `w1 [d, d_ff]`
    /// (gated: `[d, 2 * d_ff]`, the gate's columns then the up projection's)
    /// and `w2 [d_ff, d]`, each with its bias or none. The parameters are
    /// `{name}.fc1`, `{name}.fc2`, or gated `{name}.gate_up`, `{name}.down`.
    pub fn from_fused_on(
        be: &Arc<B>,
        name: &str,
        kind: MlpKind,
        (w1, b1): (&Tensor, Option<&Tensor>),
        (w2, b2): (&Tensor, Option<&Tensor>),
        tp: TpShard,
    ) -> Result<Self> {
        let (n1, n2) = match kind {
            MlpKind::Gelu => ("fc1", "fc2"),
            MlpKind::SwiGlu | MlpKind::GeGlu => ("gate_up", "down"),
        };
        let (n1, n2) = (format!("{name}.{n1}"), format!("{name}.{n2}"));
        let groups = kind.fc1_width();
        Ok(Self {
            fc1: ColumnParallelLinear::from_full_on(be, &n1, w1, b1, groups, tp)?,
            fc2: RowParallelLinear::from_full_on(be, &n2, w2, b2, tp)?,
            kind,
        })
    }

    /// This rank's shard of a gated MLP (`kind` SwiGLU or GeGLU) with full
    /// weights `w_gate [d, d_ff]`, `w_up [d, d_ff]`, `w_down [d_ff, d]` and no
    /// biases (as Llama's).
    pub fn gated_from_full_on(
        be: &Arc<B>,
        name: &str,
        kind: GluKind,
        (w_gate, w_up): (&Tensor, &Tensor),
        w_down: &Tensor,
        tp: TpShard,
    ) -> Result<Self> {
        let fused = Tensor::concat_cols(&[w_gate, w_up])?;
        let kind = match kind {
            GluKind::SwiGlu => MlpKind::SwiGlu,
            GluKind::GeGlu => MlpKind::GeGlu,
        };
        Self::from_fused_on(be, name, kind, (&fused, None), (w_down, None), tp)
    }

    /// The MLP's form.
    pub fn kind(&self) -> MlpKind {
        self.kind
    }

    /// Forward up to `fc2`'s partial sum (no `fc2` bias, not reduced).
    pub fn forward_partial(&self, x: B::Storage) -> Result<(B::Storage, MlpStash<B>)> {
        self.forward_keeping(x, None)
    }

    /// [`Mlp::forward_partial`], keeping `kept_input` in place of `x` where given
    /// (sequence parallelism keeps the slice, not the gathered input).
    fn forward_keeping(
        &self,
        x: B::Storage,
        kept_input: Option<B::Kept>,
    ) -> Result<(B::Storage, MlpStash<B>)> {
        let be = self.fc1.local.backend();
        let h = self.fc1.local.forward(&x)?;
        let a = match self.kind.glu() {
            None => be.gelu(&h)?,
            Some(k) => be.glu(&h, k)?,
        };
        let y = self.fc2.forward_partial(&a)?;
        let x = match kept_input {
            Some(k) => k,
            None => be.keep(x)?,
        };
        let (h, a) = (be.keep(h)?, be.keep(a)?);
        Ok((y, MlpStash { x, h, a }))
    }

    /// Full forward: partial sum, all-reduce, `fc2` bias.
    pub fn forward(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MlpStash<B>)> {
        let (mut y, stash) = self.forward_partial(x)?;
        tp.all_reduce_sum(&mut y)?;
        self.fc2.add_bias(&mut y)?;
        Ok((y, stash))
    }

    /// Sequence-parallel forward ([`seq`]): `x` is this rank's slice,
    /// all-gathered before `fc1`; `fc2`'s partial sums are reduce-scattered
    /// back to the slice. The stash keeps the input slice only.
    pub fn forward_seq(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        shard: TpShard,
    ) -> Result<(B::Storage, MlpStash<B>)> {
        let be = self.fc1.local.backend().clone();
        let full = seq::gather(&*be, tp, &x, shard)?;
        let (y, stash) = self.forward_keeping(full, Some(be.keep(x)?))?;
        let mut y = seq::scatter(&*be, tp, y, shard)?;
        self.fc2.add_bias(&mut y)?;
        Ok((y, stash))
    }

    /// Sequence-parallel input backward: the output gradient's slice and the
    /// stashed input slice are all-gathered, the input gradient reduce-scattered.
    pub fn backward_input_seq(
        &self,
        mut stash: MlpStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        shard: TpShard,
    ) -> Result<(B::Storage, MlpWeightStash<B>)> {
        let be = self.fc1.local.backend().clone();
        let full = seq::gather(&*be, tp, &*be.restore(&stash.x)?, shard)?;
        stash.x = be.keep(full)?;
        let dy = seq::gather(&*be, tp, &dy, shard)?;
        let (dx, ws) = self.backward_input_partial(stash, dy)?;
        Ok((seq::scatter(&*be, tp, dx, shard)?, ws))
    }

    /// Input backward up to the partial input gradient (not reduced).
    pub fn backward_input_partial(
        &self,
        stash: MlpStash<B>,
        dy: B::Storage,
    ) -> Result<(B::Storage, MlpWeightStash<B>)> {
        let be = self.fc1.local.backend();
        let da = self.fc2.local.backward_input(&dy)?;
        let h = be.restore(&stash.h)?;
        let dh = match self.kind.glu() {
            None => be.gelu_backward(&h, &da)?,
            Some(k) => be.glu_backward(&h, &da, k)?,
        };
        drop(h);
        let dx = self.fc1.local.backward_input(&dh)?;
        let ws = MlpWeightStash {
            x: stash.x,
            dh: be.keep(dh)?,
            a: stash.a,
            dy: be.keep(dy)?,
        };
        Ok((dx, ws))
    }

    /// Input backward (I): the full input gradient after the all-reduce.
    pub fn backward_input(
        &self,
        stash: MlpStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MlpWeightStash<B>)> {
        let (mut dx, ws) = self.backward_input_partial(stash, dy)?;
        tp.all_reduce_sum(&mut dx)?;
        Ok((dx, ws))
    }

    /// Weight backward (W): accumulates into `fc1` and `fc2` gradients.
    pub fn backward_weight(&mut self, ws: MlpWeightStash<B>) -> Result<()> {
        let be = self.fc1.local.backend().clone();
        let (x, dh) = (be.restore(&ws.x)?, be.restore(&ws.dh)?);
        self.fc1.local.backward_weight(&x, &dh)?;
        let (a, dy) = (be.restore(&ws.a)?, be.restore(&ws.dy)?);
        self.fc2.local.backward_weight(&a, &dy)
    }
}
