//! LayerNorm, RMSNorm and the token + position embedding as layers with
//! parameters; [`Norm`] is either norm, as a block or the head holds it.

use super::{cpu_backend, Param, Parameters};
use crate::backend::Backend;
use crate::cpu::Cpu;
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

/// RMSNorm over the last dimension with a learned scale (no shift).
#[derive(Debug)]
pub struct RmsNorm<B: Backend = Cpu> {
    /// Scale `[d]`, initialised to 1.
    pub gamma: Param<B::Storage>,
    /// Added to the mean square.
    pub eps: f32,
    be: Arc<B>,
}

super::clone_if_tensors_clone!(RmsNorm { gamma, eps, be });

impl RmsNorm {
    /// The identity-initialised norm of width `d`, eps 1e-5.
    pub fn new(name: &str, d: usize) -> Self {
        Self::on(&cpu_backend(), name, d).expect("the host backend does not fail")
    }
}

impl<B: Backend> RmsNorm<B> {
    /// [`RmsNorm::new`] on `be`.
    pub fn on(be: &Arc<B>, name: &str, d: usize) -> Result<Self> {
        let ones = Tensor::new(&[d], vec![1.0; d])?;
        Ok(Self {
            gamma: Param::on(&**be, format!("{name}.gamma"), &ones, false)?,
            eps: 1e-5,
            be: be.clone(),
        })
    }

    /// Forward; the stash serves both backward parts.
    pub fn forward(&self, x: &B::Storage) -> Result<(B::Storage, B::NormStash)> {
        self.be.rms_norm(x, &self.gamma.value, self.eps)
    }

    /// Input gradient (I).
    pub fn backward_input(&self, dy: &B::Storage, stash: &B::NormStash) -> Result<B::Storage> {
        self.be
            .rms_norm_backward_input(dy, &self.gamma.value, stash)
    }

    /// Weight gradient (W), from the forward's stash and the output gradient.
    pub fn backward_weight(&mut self, dy: &B::Storage, stash: &B::NormStash) -> Result<()> {
        self.be
            .rms_norm_backward_weight(dy, stash, &mut self.gamma.grad)
    }
}

impl<B: Backend> Parameters<B::Storage> for RmsNorm<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        f(&self.gamma);
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        f(&mut self.gamma);
    }
}

/// Which normalisation a model uses: LayerNorm with scale and shift (GPT-2), or RMSNorm with
/// a scale (Llama, Mistral, Qwen). Defined once in `pipewright-kinds`.
pub use pipewright_kinds::NormKind;

/// A norm of either kind; both keep the same stash (`x̂` and `1/σ` per row).
#[derive(Debug)]
pub enum Norm<B: Backend = Cpu> {
    /// LayerNorm.
    Layer(LayerNorm<B>),
    /// RMSNorm.
    Rms(RmsNorm<B>),
}

impl<B: Backend> Clone for Norm<B>
where
    B::Storage: Clone,
    B::NormStash: Clone,
    B::AttnStash: Clone,
    B::Kept: Clone,
{
    fn clone(&self) -> Self {
        match self {
            Norm::Layer(n) => Norm::Layer(n.clone()),
            Norm::Rms(n) => Norm::Rms(n.clone()),
        }
    }
}

impl<B: Backend> From<LayerNorm<B>> for Norm<B> {
    fn from(n: LayerNorm<B>) -> Self {
        Norm::Layer(n)
    }
}

impl<B: Backend> From<RmsNorm<B>> for Norm<B> {
    fn from(n: RmsNorm<B>) -> Self {
        Norm::Rms(n)
    }
}

impl<B: Backend> Norm<B> {
    /// The identity-initialised norm of `kind` and width `d` on `be`.
    pub fn on(be: &Arc<B>, kind: NormKind, name: &str, d: usize) -> Result<Self> {
        Ok(match kind {
            NormKind::LayerNorm => Norm::Layer(LayerNorm::on(be, name, d)?),
            NormKind::RmsNorm => Norm::Rms(RmsNorm::on(be, name, d)?),
        })
    }

    /// Which norm this is.
    pub fn kind(&self) -> NormKind {
        match self {
            Norm::Layer(_) => NormKind::LayerNorm,
            Norm::Rms(_) => NormKind::RmsNorm,
        }
    }

    /// The backend this layer runs on.
    pub fn backend(&self) -> &Arc<B> {
        match self {
            Norm::Layer(n) => &n.be,
            Norm::Rms(n) => &n.be,
        }
    }

    /// The scale (both kinds have one).
    pub fn gamma_mut(&mut self) -> &mut Param<B::Storage> {
        match self {
            Norm::Layer(n) => &mut n.gamma,
            Norm::Rms(n) => &mut n.gamma,
        }
    }

    /// Forward; the stash serves both backward parts.
    pub fn forward(&self, x: &B::Storage) -> Result<(B::Storage, B::NormStash)> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }

    /// Input gradient (I).
    pub fn backward_input(&self, dy: &B::Storage, stash: &B::NormStash) -> Result<B::Storage> {
        match self {
            Norm::Layer(n) => n.backward_input(dy, stash),
            Norm::Rms(n) => n.backward_input(dy, stash),
        }
    }

    /// Weight gradient (W), from the forward's stash and the output gradient.
    pub fn backward_weight(&mut self, dy: &B::Storage, stash: &B::NormStash) -> Result<()> {
        match self {
            Norm::Layer(n) => n.backward_weight(dy, stash),
            Norm::Rms(n) => n.backward_weight(dy, stash),
        }
    }
}

impl<B: Backend> Parameters<B::Storage> for Norm<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        match self {
            Norm::Layer(n) => n.visit(f),
            Norm::Rms(n) => n.visit(f),
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        match self {
            Norm::Layer(n) => n.visit_mut(f),
            Norm::Rms(n) => n.visit_mut(f),
        }
    }
}

/// Token embedding `[vocab, d]` plus learned positions `[max_seq, d]`, or tokens alone where
/// positions are rotary. Replicated on every TP rank (it is small next to the blocks).
#[derive(Debug)]
pub struct Embedding<B: Backend = Cpu> {
    /// Token table.
    pub wte: Param<B::Storage>,
    /// Position table; none where positions are rotary (they enter in attention).
    pub wpe: Option<Param<B::Storage>>,
    be: Arc<B>,
}

super::clone_if_tensors_clone!(Embedding { wte, wpe, be });

impl Embedding {
    /// A layer from its two tables (`{name}.wte`, `{name}.wpe`).
    pub fn new(name: &str, wte: Tensor, wpe: Tensor) -> Self {
        Self::on(&cpu_backend(), name, &wte, Some(&wpe)).expect("the host backend does not fail")
    }
}

impl<B: Backend> Embedding<B> {
    /// [`Embedding::new`] on `be`, from host tables (uploaded); without `wpe`, tokens only.
    pub fn on(be: &Arc<B>, name: &str, wte: &Tensor, wpe: Option<&Tensor>) -> Result<Self> {
        let wpe = wpe.map(|t| Param::on(&**be, format!("{name}.wpe"), t, false));
        Ok(Self {
            wte: Param::on(&**be, format!("{name}.wte"), wte, true)?,
            wpe: wpe.transpose()?,
            be: be.clone(),
        })
    }

    /// `[batch, seq, d]` embeddings of `ids` (`batch * seq` of them).
    pub fn forward(&self, ids: &[u32], seq: usize) -> Result<B::Storage> {
        let wpe = self.wpe.as_ref().map(|p| &p.value);
        self.be.embedding(ids, seq, &self.wte.value, wpe)
    }

    /// Weight gradient (W); there is no input gradient.
    pub fn backward_weight(&mut self, ids: &[u32], seq: usize, dy: &B::Storage) -> Result<()> {
        let dwpe = self.wpe.as_mut().map(|p| &mut p.grad);
        self.be
            .embedding_backward_weight(ids, seq, dy, &mut self.wte.grad, dwpe)
    }
}

impl<B: Backend> Parameters<B::Storage> for Embedding<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        f(&self.wte);
        if let Some(p) = &self.wpe {
            f(p);
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        f(&mut self.wte);
        if let Some(p) = &mut self.wpe {
            f(p);
        }
    }
}
