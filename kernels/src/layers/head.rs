//! Final norm, LM head and cross-entropy loss: the end of the last stage.
//!
//! Replicated on every TP rank (a vocabulary-parallel head is left out).

use super::linear::Linear;
use super::norm::Norm;
use super::Parameters;
use crate::backend::Backend;
use crate::cpu::Cpu;
use crate::error::Result;

/// Final norm and projection to vocabulary logits.
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, ln_f, proj)]
pub struct LmHead<B: Backend = Cpu> {
    /// Final norm.
    pub ln_f: Norm<B>,
    /// `[d, vocab]` projection with bias.
    pub proj: Linear<B>,
}

super::clone_if_tensors_clone!(LmHead { ln_f, proj });

/// What the head's input backward needs: the normed input kept in the backend's
/// activation format; the softmax probabilities in f32 storage, since the loss gradient
/// `p - onehot` of a confident prediction is a small difference of numbers near 1 that
/// bf16 would mostly erase (PyTorch autocast and Megatron keep the loss's softmax in f32).
#[derive(Debug)]
pub struct HeadStash<B: Backend = Cpu> {
    ln: B::NormStash,
    n: B::Kept,
    probs: B::Storage,
    targets: Vec<u32>,
    scale: f32,
}

super::clone_if_tensors_clone!(HeadStash {
    ln,
    n,
    probs,
    targets,
    scale
});
super::footprint_of!(HeadStash {
    ln,
    n,
    probs,
    targets
});

/// What the head's weight backward needs.
#[derive(Debug)]
pub struct HeadWeightStash<B: Backend = Cpu> {
    ln: B::NormStash,
    dn: B::Kept,
    n: B::Kept,
    dlogits: B::Kept,
}

super::clone_if_tensors_clone!(HeadWeightStash { ln, dn, n, dlogits });
super::footprint_of!(HeadWeightStash { ln, dn, n, dlogits });

impl<B: Backend> LmHead<B> {
    /// Loss `scale * mean CE(head(x), targets)` (see
    /// [`cross_entropy`](crate::cpu::cross_entropy)) and the stash.
    pub fn forward(
        &self,
        x: &B::Storage,
        targets: &[u32],
        scale: f32,
    ) -> Result<(f32, HeadStash<B>)> {
        let (n, ln) = self.ln_f.forward(x)?;
        let logits = self.proj.forward(&n)?;
        let be = self.proj.backend();
        let (loss, probs) = be.cross_entropy(&logits, targets, scale)?;
        let stash = HeadStash {
            ln,
            n: be.keep(n)?,
            probs,
            targets: targets.to_vec(),
            scale,
        };
        Ok((loss, stash))
    }

    /// Input backward (I): gradient of the loss with respect to `x`.
    pub fn backward_input(&self, stash: HeadStash<B>) -> Result<(B::Storage, HeadWeightStash<B>)> {
        let be = self.proj.backend();
        let dlogits = be.cross_entropy_backward(stash.probs, &stash.targets, stash.scale)?;
        let dn = self.proj.backward_input(&dlogits)?;
        let dx = self.ln_f.backward_input(&dn, &stash.ln)?;
        let ws = HeadWeightStash {
            ln: stash.ln,
            dn: be.keep(dn)?,
            n: stash.n,
            dlogits: be.keep(dlogits)?,
        };
        Ok((dx, ws))
    }

    /// Weight backward (W).
    pub fn backward_weight(&mut self, ws: HeadWeightStash<B>) -> Result<()> {
        let be = self.proj.backend().clone();
        self.ln_f.backward_weight(&*be.restore(&ws.dn)?, &ws.ln)?;
        self.proj
            .backward_weight(&*be.restore(&ws.n)?, &*be.restore(&ws.dlogits)?)
    }
}
