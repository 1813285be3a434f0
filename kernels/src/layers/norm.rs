//! LayerNorm and the token + position embedding as layers with parameters.

use super::{Param, Parameters};
use crate::cpu::{
    embedding, embedding_backward_weight, layer_norm, layer_norm_backward_input,
    layer_norm_backward_weight, LayerNormStash,
};
use crate::error::Result;
use crate::tensor::Tensor;

/// LayerNorm over the last dimension with learned scale and shift.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// Scale `[d]`, initialised to 1.
    pub gamma: Param,
    /// Shift `[d]`, initialised to 0.
    pub beta: Param,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// The identity-initialised norm of width `d`, eps 1e-5.
    pub fn new(name: &str, d: usize) -> Self {
        let ones = Tensor::new(&[d], vec![1.0; d]).expect("length d");
        Self {
            gamma: Param::new(format!("{name}.gamma"), ones, false),
            beta: Param::new(format!("{name}.beta"), Tensor::zeros(&[d]), false),
            eps: 1e-5,
        }
    }

    /// Forward; the stash serves both backward parts.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, LayerNormStash)> {
        layer_norm(x, &self.gamma.value, &self.beta.value, self.eps)
    }

    /// Input gradient (I).
    pub fn backward_input(&self, dy: &Tensor, stash: &LayerNormStash) -> Result<Tensor> {
        layer_norm_backward_input(dy, &self.gamma.value, stash)
    }

    /// Weight gradient (W), from the stash's `xhat` and the output gradient.
    pub fn backward_weight(&mut self, dy: &Tensor, xhat: &Tensor) -> Result<()> {
        layer_norm_backward_weight(dy, xhat, &mut self.gamma.grad, &mut self.beta.grad)
    }
}

impl Parameters for LayerNorm {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.gamma);
        f(&self.beta);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        f(&mut self.gamma);
        f(&mut self.beta);
    }
}

/// Token embedding `[vocab, d]` plus learned positions `[max_seq, d]`.
/// Replicated on every TP rank (it is small next to the blocks).
#[derive(Clone, Debug)]
pub struct Embedding {
    /// Token table.
    pub wte: Param,
    /// Position table.
    pub wpe: Param,
}

impl Embedding {
    /// A layer from its two tables (`{name}.wte`, `{name}.wpe`).
    pub fn new(name: &str, wte: Tensor, wpe: Tensor) -> Self {
        Self {
            wte: Param::new(format!("{name}.wte"), wte, true),
            wpe: Param::new(format!("{name}.wpe"), wpe, false),
        }
    }

    /// `[batch, seq, d]` embeddings of `ids` (`batch * seq` of them).
    pub fn forward(&self, ids: &[u32], seq: usize) -> Result<Tensor> {
        embedding(ids, seq, &self.wte.value, &self.wpe.value)
    }

    /// Weight gradient (W); there is no input gradient.
    pub fn backward_weight(&mut self, ids: &[u32], seq: usize, dy: &Tensor) -> Result<()> {
        embedding_backward_weight(ids, seq, dy, &mut self.wte.grad, &mut self.wpe.grad)
    }
}

impl Parameters for Embedding {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.wte);
        f(&self.wpe);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        f(&mut self.wte);
        f(&mut self.wpe);
    }
}
