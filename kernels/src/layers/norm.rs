//! LayerNorm and the token + position embedding as layers with parameters.

use super::{cpu_backend, Param, Parameters};
use crate::backend::{Backend, Cpu};
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Arc;

/// LayerNorm over the last dimension with learned scale and shift.
#[derive(Debug)]
pub struct LayerNorm<B: Backend = Cpu> {
    /// Scale `[d]`, initialised to 1.
    pub gamma: Param<B::Storage>,
    /// Shift `[d]`, initialised to 0.
    pub beta: Param<B::Storage>,
    /// Added to the variance.
    pub eps: f32,
    be: Arc<B>,
}

super::clone_if_tensors_clone!(LayerNorm {
    gamma,
    beta,
    eps,
    be
});

impl LayerNorm {
    /// The identity-initialised norm of width `d`, eps 1e-5.
    pub fn new(name: &str, d: usize) -> Self {
        Self::on(&cpu_backend(), name, d).expect("the host backend does not fail")
    }
}

impl<B: Backend> LayerNorm<B> {
    /// [`LayerNorm::new`] on `be`.
    pub fn on(be: &Arc<B>, name: &str, d: usize) -> Result<Self> {
        let ones = Tensor::new(&[d], vec![1.0; d])?;
        Ok(Self {
            gamma: Param::on(&**be, format!("{name}.gamma"), &ones, false)?,
            beta: Param::on(&**be, format!("{name}.beta"), &Tensor::zeros(&[d]), false)?,
            eps: 1e-5,
            be: be.clone(),
        })
    }

    /// The backend this layer runs on.
    pub fn backend(&self) -> &Arc<B> {
        &self.be
    }

    /// Forward; the stash serves both backward parts.
    pub fn forward(&self, x: &B::Storage) -> Result<(B::Storage, B::NormStash)> {
        self.be
            .layer_norm(x, &self.gamma.value, &self.beta.value, self.eps)
    }

    /// Input gradient (I).
    pub fn backward_input(&self, dy: &B::Storage, stash: &B::NormStash) -> Result<B::Storage> {
        self.be
            .layer_norm_backward_input(dy, &self.gamma.value, stash)
    }

    /// Weight gradient (W), from the forward's stash and the output gradient.
    pub fn backward_weight(&mut self, dy: &B::Storage, stash: &B::NormStash) -> Result<()> {
        self.be
            .layer_norm_backward_weight(dy, stash, &mut self.gamma.grad, &mut self.beta.grad)
    }
}

impl<B: Backend> Parameters<B::Storage> for LayerNorm<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        f(&self.gamma);
        f(&self.beta);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        f(&mut self.gamma);
        f(&mut self.beta);
    }
}

/// Token embedding `[vocab, d]` plus learned positions `[max_seq, d]`.
/// Replicated on every TP rank (it is small next to the blocks).
#[derive(Debug)]
pub struct Embedding<B: Backend = Cpu> {
    /// Token table.
    pub wte: Param<B::Storage>,
    /// Position table.
    pub wpe: Param<B::Storage>,
    be: Arc<B>,
}

super::clone_if_tensors_clone!(Embedding { wte, wpe, be });

impl Embedding {
    /// A layer from its two tables (`{name}.wte`, `{name}.wpe`).
    pub fn new(name: &str, wte: Tensor, wpe: Tensor) -> Self {
        Self::on(&cpu_backend(), name, &wte, &wpe).expect("the host backend does not fail")
    }
}

impl<B: Backend> Embedding<B> {
    /// [`Embedding::new`] on `be`, from host tables (uploaded).
    pub fn on(be: &Arc<B>, name: &str, wte: &Tensor, wpe: &Tensor) -> Result<Self> {
        Ok(Self {
            wte: Param::on(&**be, format!("{name}.wte"), wte, true)?,
            wpe: Param::on(&**be, format!("{name}.wpe"), wpe, false)?,
            be: be.clone(),
        })
    }

    /// `[batch, seq, d]` embeddings of `ids` (`batch * seq` of them).
    pub fn forward(&self, ids: &[u32], seq: usize) -> Result<B::Storage> {
        self.be
            .embedding(ids, seq, &self.wte.value, &self.wpe.value)
    }

    /// Weight gradient (W); there is no input gradient.
    pub fn backward_weight(&mut self, ids: &[u32], seq: usize, dy: &B::Storage) -> Result<()> {
        self.be
            .embedding_backward_weight(ids, seq, dy, &mut self.wte.grad, &mut self.wpe.grad)
    }
}

impl<B: Backend> Parameters<B::Storage> for Embedding<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        f(&self.wte);
        f(&self.wpe);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        f(&mut self.wte);
        f(&mut self.wpe);
    }
}
