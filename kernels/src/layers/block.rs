//! The pre-norm transformer block:
//! `h = x + attn(ln1(x))`, `out = h + mlp(ln2(h))`.

use super::attention::{Attention, AttentionStash, AttentionWeightStash};
use super::ffn::{FeedForward, FfnStash, FfnWeightStash};
use super::norm::Norm;
use super::shard::TpShard;
use super::{Param, Parameters, TpReduce};
use crate::backend::Backend;
use crate::cpu::Cpu;
use crate::error::Result;

/// A TP rank's share of one transformer block. Norms are replicated; the
/// residual stream is whole on every rank (after the all-reduces), or with
/// sequence parallelism ([`super::seq`]) this rank's `seq / t` slice of it.
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, ln1, attn, ln2, mlp)]
pub struct Block<B: Backend = Cpu> {
    /// Norm before attention.
    pub ln1: Norm<B>,
    /// Head-split attention.
    pub attn: Attention<B>,
    /// Norm before the MLP.
    pub ln2: Norm<B>,
    /// Column-then-row MLP (plain or gated), or a mixture of experts.
    pub mlp: FeedForward<B>,
}

super::clone_if_tensors_clone!(Block {
    ln1,
    attn,
    ln2,
    mlp
});

/// What the block's input backward needs.
#[derive(Debug)]
pub struct BlockStash<B: Backend = Cpu> {
    ln1: B::NormStash,
    attn: AttentionStash<B>,
    ln2: B::NormStash,
    mlp: FfnStash<B>,
}

super::clone_if_tensors_clone!(BlockStash {
    ln1,
    attn,
    ln2,
    mlp
});
super::footprint_of!(BlockStash {
    ln1,
    attn,
    ln2,
    mlp
});

impl<B: Backend> BlockStash<B> {
    /// Drops the attention probabilities (selective recomputation).
    pub fn drop_attention_core(&mut self) {
        self.attn.drop_core();
    }
}

/// What the block's weight backward needs: each norm's forward stash and
/// output gradient (kept), and the attention's and MLP's weight stashes.
#[derive(Debug)]
pub struct BlockWeightStash<B: Backend = Cpu> {
    ln1: (B::NormStash, B::Kept),
    attn: AttentionWeightStash<B>,
    ln2: (B::NormStash, B::Kept),
    mlp: FfnWeightStash<B>,
}

super::clone_if_tensors_clone!(BlockWeightStash {
    ln1,
    attn,
    ln2,
    mlp
});
super::footprint_of!(BlockWeightStash {
    ln1,
    attn,
    ln2,
    mlp
});

impl<B: Backend> Block<B> {
    /// Forward of `x` (`[batch, seq, d]`); two all-reduces when `tp > 1`.
    pub fn forward(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, BlockStash<B>)> {
        self.forward_seq(x, tp, None)
    }

    /// [`Block::forward`], or with `sp = Some(shard)` sequence-parallel: `x`
    /// and the output are this rank's slices `[batch, seq / t, d]`, the
    /// norms and residual adds run on the slice, and each all-reduce becomes
    /// an all-gather before the column-parallel linear and a reduce-scatter
    /// after the row-parallel one.
    pub fn forward_seq(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        sp: Option<TpShard>,
    ) -> Result<(B::Storage, BlockStash<B>)> {
        let be = self.ln1.backend();
        let (n1, ln1) = self.ln1.forward(&x)?;
        let (a, attn) = match sp {
            Some(shard) => self.attn.forward_seq(n1, tp, shard)?,
            None => self.attn.forward(n1, tp)?,
        };
        let mut h = x;
        be.add_assign(&mut h, &a)?;
        let (n2, ln2) = self.ln2.forward(&h)?;
        let (m, mlp) = self.mlp.forward_seq(n2, tp, sp)?;
        be.add_assign(&mut h, &m)?;
        // The residual stream is stored in the activation precision (bf16 in a bf16 run),
        // so a pipeline boundary between blocks rounds nothing a single device does not.
        be.round_activation(&mut h)?;
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
        stash: BlockStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, BlockWeightStash<B>)> {
        self.backward_input_seq(stash, dy, tp, None)
    }

    /// [`Block::backward_input`] of a [`Block::forward_seq`] with the same
    /// `sp`: under sequence parallelism `dy` and the result are slices, and
    /// the norms' weight gradients (from W) are this rank's part only, to be
    /// summed over the TP group once per step.
    pub fn backward_input_seq(
        &self,
        stash: BlockStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        sp: Option<TpShard>,
    ) -> Result<(B::Storage, BlockWeightStash<B>)> {
        let be = self.ln1.backend();
        // The residual passes dy straight to h; the MLP branch adds to it.
        let (dn2, mlp) = self
            .mlp
            .backward_input_seq(stash.mlp, be.copy(&dy)?, tp, sp)?;
        let mut dh = dy;
        be.add_assign(&mut dh, &self.ln2.backward_input(&dn2, &stash.ln2)?)?;
        let (dn1, attn) = match sp {
            Some(shard) => self
                .attn
                .backward_input_seq(stash.attn, be.copy(&dh)?, tp, shard)?,
            None => self.attn.backward_input(stash.attn, be.copy(&dh)?, tp)?,
        };
        let mut dx = dh;
        be.add_assign(&mut dx, &self.ln1.backward_input(&dn1, &stash.ln1)?)?;
        be.round_activation(&mut dx)?;
        let ws = BlockWeightStash {
            ln1: (stash.ln1, be.keep(dn1)?),
            attn,
            ln2: (stash.ln2, be.keep(dn2)?),
            mlp,
        };
        Ok((dx, ws))
    }

    /// Rebuilds the attention probabilities a selective stash dropped.
    pub fn recompute_attention_core(&self, stash: &mut BlockStash<B>) -> Result<()> {
        self.attn.recompute_core(&mut stash.attn)
    }

    /// Weight backward (W) of all four parts.
    pub fn backward_weight(&mut self, ws: BlockWeightStash<B>) -> Result<()> {
        let be = self.ln1.backend().clone();
        self.ln1
            .backward_weight(&*be.restore(&ws.ln1.1)?, &ws.ln1.0)?;
        self.attn.backward_weight(ws.attn)?;
        self.ln2
            .backward_weight(&*be.restore(&ws.ln2.1)?, &ws.ln2.0)?;
        self.mlp.backward_weight(ws.mlp)
    }
}

impl<B: Backend> Block<B> {
    /// Calls `f` on the two norms' parameters (those of `ln1`, then of `ln2`): under
    /// sequence parallelism their gradients are per-rank parts.
    pub fn visit_norm_params_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        self.ln1.visit_mut(f);
        self.ln2.visit_mut(f);
    }
}
