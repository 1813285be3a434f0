//! The GeLU MLP: column-parallel `fc1`, GeLU, row-parallel `fc2`.
//!
//! With `tp` ranks each holds `d_ff / tp` hidden units; the hidden layer
//! never crosses ranks. Forward needs one all-reduce (after `fc2`), the
//! input backward one (of the gradient reaching `fc1`'s input).

use super::linear::{ColumnParallelLinear, RowParallelLinear};
use super::shard::TpShard;
use super::{Param, Parameters, TpReduce};
use crate::cpu::{gelu, gelu_backward};
use crate::error::Result;
use crate::tensor::Tensor;

/// A TP rank's shard of the MLP (the whole MLP when `tp = 1`).
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[d, d_ff / tp]`.
    pub fc1: ColumnParallelLinear,
    /// `[d_ff / tp, d]`, full bias.
    pub fc2: RowParallelLinear,
}

/// What the MLP's input backward needs.
#[derive(Clone, Debug)]
pub struct MlpStash {
    x: Tensor,
    h: Tensor,
    a: Tensor,
}

/// What the MLP's weight backward needs.
#[derive(Clone, Debug)]
pub struct MlpWeightStash {
    x: Tensor,
    dh: Tensor,
    a: Tensor,
    dy: Tensor,
}

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
        Ok(Self {
            fc1: ColumnParallelLinear::from_full(&format!("{name}.fc1"), w1, Some(b1), 1, tp)?,
            fc2: RowParallelLinear::from_full(&format!("{name}.fc2"), w2, Some(b2), tp)?,
        })
    }

    /// Forward up to `fc2`'s partial sum (no `fc2` bias, not reduced).
    pub fn forward_partial(&self, x: Tensor) -> Result<(Tensor, MlpStash)> {
        let h = self.fc1.local.forward(&x)?;
        let a = gelu(&h);
        let y = self.fc2.forward_partial(&a)?;
        Ok((y, MlpStash { x, h, a }))
    }

    /// Full forward: partial sum, all-reduce, `fc2` bias.
    pub fn forward(&self, x: Tensor, tp: &mut dyn TpReduce) -> Result<(Tensor, MlpStash)> {
        let (mut y, stash) = self.forward_partial(x)?;
        tp.all_reduce_sum(&mut y)?;
        self.fc2.add_bias(&mut y)?;
        Ok((y, stash))
    }

    /// Input backward up to the partial input gradient (not reduced).
    pub fn backward_input_partial(
        &self,
        stash: MlpStash,
        dy: Tensor,
    ) -> Result<(Tensor, MlpWeightStash)> {
        let da = self.fc2.local.backward_input(&dy)?;
        let dh = gelu_backward(&stash.h, &da)?;
        let dx = self.fc1.local.backward_input(&dh)?;
        let ws = MlpWeightStash {
            x: stash.x,
            dh,
            a: stash.a,
            dy,
        };
        Ok((dx, ws))
    }

    /// Input backward (I): the full input gradient after the all-reduce.
    pub fn backward_input(
        &self,
        stash: MlpStash,
        dy: Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, MlpWeightStash)> {
        let (mut dx, ws) = self.backward_input_partial(stash, dy)?;
        tp.all_reduce_sum(&mut dx)?;
        Ok((dx, ws))
    }

    /// Weight backward (W): accumulates into `fc1` and `fc2` gradients.
    pub fn backward_weight(&mut self, ws: MlpWeightStash) -> Result<()> {
        self.fc1.local.backward_weight(&ws.x, &ws.dh)?;
        self.fc2.local.backward_weight(&ws.a, &ws.dy)
    }
}

impl Parameters for Mlp {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.fc1.local.visit(f);
        self.fc2.local.visit(f);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.fc1.local.visit_mut(f);
        self.fc2.local.visit_mut(f);
    }
}
