//! Final LayerNorm, LM head and cross-entropy loss: the end of the last stage.
//!
//! Replicated on every TP rank (a vocabulary-parallel head is left out).

use super::linear::Linear;
use super::norm::LayerNorm;
use super::{Param, Parameters};
use crate::cpu::{cross_entropy, cross_entropy_backward, LayerNormStash};
use crate::error::Result;
use crate::tensor::Tensor;

/// Final norm and projection to vocabulary logits.
#[derive(Clone, Debug)]
pub struct LmHead {
    /// Final norm.
    pub ln_f: LayerNorm,
    /// `[d, vocab]` projection with bias.
    pub proj: Linear,
}

/// What the head's input backward needs.
#[derive(Clone, Debug)]
pub struct HeadStash {
    ln: LayerNormStash,
    n: Tensor,
    probs: Tensor,
    targets: Vec<u32>,
    scale: f32,
}

/// What the head's weight backward needs.
#[derive(Clone, Debug)]
pub struct HeadWeightStash {
    xhat: Tensor,
    dn: Tensor,
    n: Tensor,
    dlogits: Tensor,
}

impl LmHead {
    /// Loss `scale * mean CE(head(x), targets)` (see
    /// [`cross_entropy`](crate::cpu::cross_entropy)) and the stash.
    pub fn forward(&self, x: &Tensor, targets: &[u32], scale: f32) -> Result<(f32, HeadStash)> {
        let (n, ln) = self.ln_f.forward(x)?;
        let logits = self.proj.forward(&n)?;
        let (loss, probs) = cross_entropy(&logits, targets, scale)?;
        let stash = HeadStash {
            ln,
            n,
            probs,
            targets: targets.to_vec(),
            scale,
        };
        Ok((loss, stash))
    }

    /// Input backward (I): gradient of the loss with respect to `x`.
    pub fn backward_input(&self, stash: HeadStash) -> Result<(Tensor, HeadWeightStash)> {
        let dlogits = cross_entropy_backward(stash.probs, &stash.targets, stash.scale)?;
        let dn = self.proj.backward_input(&dlogits)?;
        let dx = self.ln_f.backward_input(&dn, &stash.ln)?;
        let ws = HeadWeightStash {
            xhat: stash.ln.xhat,
            dn,
            n: stash.n,
            dlogits,
        };
        Ok((dx, ws))
    }

    /// Weight backward (W).
    pub fn backward_weight(&mut self, ws: HeadWeightStash) -> Result<()> {
        self.ln_f.backward_weight(&ws.dn, &ws.xhat)?;
        self.proj.backward_weight(&ws.n, &ws.dlogits)
    }
}

impl Parameters for LmHead {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.ln_f.visit(f);
        self.proj.visit(f);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.ln_f.visit_mut(f);
        self.proj.visit_mut(f);
    }
}
