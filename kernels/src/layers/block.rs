//! The pre-norm transformer block:
//! `h = x + attn(ln1(x))`, `out = h + mlp(ln2(h))`.

use super::attention::{Attention, AttentionStash, AttentionWeightStash};
use super::mlp::{Mlp, MlpStash, MlpWeightStash};
use super::norm::LayerNorm;
use super::{Param, Parameters, TpReduce};
use crate::cpu::LayerNormStash;
use crate::error::Result;
use crate::tensor::Tensor;

/// A TP rank's share of one transformer block. Norms are replicated; the
/// residual stream is whole on every rank (after the all-reduces).
#[derive(Clone, Debug)]
pub struct Block {
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Head-split attention.
    pub attn: Attention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// Column-then-row MLP.
    pub mlp: Mlp,
}

/// What the block's input backward needs.
#[derive(Clone, Debug)]
pub struct BlockStash {
    ln1: LayerNormStash,
    attn: AttentionStash,
    ln2: LayerNormStash,
    mlp: MlpStash,
}

/// What the block's weight backward needs.
#[derive(Clone, Debug)]
pub struct BlockWeightStash {
    ln1: (Tensor, Tensor),
    attn: AttentionWeightStash,
    ln2: (Tensor, Tensor),
    mlp: MlpWeightStash,
}

impl Block {
    /// Forward of `x` (`[batch, seq, d]`); two all-reduces when `tp > 1`.
    pub fn forward(&self, x: Tensor, tp: &mut dyn TpReduce) -> Result<(Tensor, BlockStash)> {
        let (n1, ln1) = self.ln1.forward(&x)?;
        let (a, attn) = self.attn.forward(n1, tp)?;
        let mut h = x;
        h.add_assign(&a)?;
        let (n2, ln2) = self.ln2.forward(&h)?;
        let (m, mlp) = self.mlp.forward(n2, tp)?;
        h.add_assign(&m)?;
        let stash = BlockStash {
            ln1,
            attn,
            ln2,
            mlp,
        };
        Ok((h, stash))
    }

    /// Input backward (I): gradient of the block input from that of its
    /// output; two all-reduces when `tp > 1`.
    pub fn backward_input(
        &self,
        stash: BlockStash,
        dy: Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, BlockWeightStash)> {
        // The residual passes dy straight to h; the MLP branch adds to it.
        let (dn2, mlp) = self.mlp.backward_input(stash.mlp, dy.clone(), tp)?;
        let mut dh = dy;
        dh.add_assign(&self.ln2.backward_input(&dn2, &stash.ln2)?)?;
        let (dn1, attn) = self.attn.backward_input(stash.attn, dh.clone(), tp)?;
        let mut dx = dh;
        dx.add_assign(&self.ln1.backward_input(&dn1, &stash.ln1)?)?;
        let ws = BlockWeightStash {
            ln1: (stash.ln1.xhat, dn1),
            attn,
            ln2: (stash.ln2.xhat, dn2),
            mlp,
        };
        Ok((dx, ws))
    }

    /// Weight backward (W) of all four parts.
    pub fn backward_weight(&mut self, ws: BlockWeightStash) -> Result<()> {
        self.ln1.backward_weight(&ws.ln1.1, &ws.ln1.0)?;
        self.attn.backward_weight(ws.attn)?;
        self.ln2.backward_weight(&ws.ln2.1, &ws.ln2.0)?;
        self.mlp.backward_weight(ws.mlp)
    }
}

impl Parameters for Block {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.ln1.visit(f);
        self.attn.visit(f);
        self.ln2.visit(f);
        self.mlp.visit(f);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.ln1.visit_mut(f);
        self.attn.visit_mut(f);
        self.ln2.visit_mut(f);
        self.mlp.visit_mut(f);
    }
}
