//! The candle bridge (feature `candle`): a chunk of a [candle](https://github.com/huggingface/candle)
//! model, a [`Module`] with the [`VarMap`] holding its variables, as a [`StageModule`] on the
//! CPU.
//!
//! Forward runs the module and keeps its output (with candle's graph behind it). Candle's
//! autograd has no vector-Jacobian product with an upstream gradient, so backward takes the
//! gradient of `sum(output * grad_out)` (with `grad_out` a constant), whose gradient with
//! respect to the stage's input (made a [`Var`]) is the input gradient, and with respect to
//! each variable, that variable's share of the loss's gradient. There is only this full
//! backward: schedules with split I/W actions (zb-*) are refused before the first step.
//! Gradients accumulate over a step's microbatches in the stage, in the [`VarMap`]'s
//! variables' name order, and the optimizer is candle's own [`AdamW`]. Tensors cross the
//! runtime as host [`Tensor`]s of f32.

use std::fmt;

pub use candle_core;
pub use candle_nn;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{Footprint, Tensor};

use crate::module::{MicrobatchData, ModuleError, Output, StageModule};

/// A candle tensor.
pub type CandleTensor = candle_core::Tensor;

/// The first stage's input, read from the user's microbatch.
pub type InputFn<D> = Box<dyn Fn(&D) -> candle_core::Result<CandleTensor>>;

/// The last stage's loss: `(output, microbatch, loss_scale)` to a scalar tensor, which must
/// already be multiplied by the runtime's loss scale.
pub type LossFn<D> = Box<dyn Fn(&CandleTensor, &D, f32) -> candle_core::Result<CandleTensor>>;

/// What the bridge refuses, beyond candle's own errors.
#[derive(Debug, thiserror::Error)]
pub enum CandleStageError {
    /// The first stage needs a function reading its input from the microbatch.
    #[error("the first candle stage has no input function (CandleStage::with_input)")]
    NoInput,
    /// A middle stage was asked for a backward without an output gradient, or the last
    /// stage was given one.
    #[error("candle stage backward: {0}")]
    Gradient(&'static str),
    /// The loss function returned a tensor that is not a scalar.
    #[error("the candle loss function returned shape {0:?}, not a scalar")]
    LossNotScalar(Vec<usize>),
    /// Flat gradients of the wrong length.
    #[error("flat gradients of {got} values for a candle stage of {expected} parameters")]
    GradLength {
        /// The stage's parameter count.
        expected: usize,
        /// What was given.
        got: usize,
    },
}

/// One candle model chunk as a pipeline stage: a [`Module`], the variables it trains (the
/// [`VarMap`]'s, taken when the stage is made, so build the module first), and for the first
/// stage an input function, for the last a loss function.
pub struct CandleStage<D> {
    module: Box<dyn Module>,
    vars: Vec<(String, Var)>,
    grads: Vec<Option<CandleTensor>>,
    input: Option<InputFn<D>>,
    loss: Option<LossFn<D>>,
    adamw: Option<AdamW>,
}

impl<D> fmt::Debug for CandleStage<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.vars.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("CandleStage")
            .field("vars", &names)
            .field("first", &self.input.is_some())
            .field("last", &self.loss.is_some())
            .finish()
    }
}

/// What forward keeps for backward: the input as a variable (not on the first stage) and
/// the output, or the loss on the last stage.
pub struct CandleStash {
    input: Option<Var>,
    out: CandleTensor,
    is_loss: bool,
}

/// The tensors the stash holds itself: the input and the output. Candle's autograd graph
/// behind the output keeps the chunk's intermediate tensors too, which candle does not
/// expose, so a candle stage's stash peaks are a lower bound.
impl Footprint for CandleStash {
    fn bytes(&self) -> usize {
        let bytes = |t: &CandleTensor| t.elem_count() * t.dtype().size_in_bytes();
        self.input.as_ref().map_or(0, |v| bytes(v.as_tensor())) + bytes(&self.out)
    }
}

impl<D> CandleStage<D> {
    /// A middle stage running `module`, training every variable of `vars` (sorted by name,
    /// the order of the flat gradients and parameters).
    pub fn new(module: impl Module + 'static, vars: &VarMap) -> Self {
        let mut vars: Vec<(String, Var)> = match vars.data().lock() {
            Ok(map) => map.iter().map(|(n, v)| (n.clone(), v.clone())).collect(),
            Err(poisoned) => poisoned
                .into_inner()
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
        };
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        CandleStage {
            module: Box::new(module),
            grads: vec![None; vars.len()],
            vars,
            input: None,
            loss: None,
            adamw: None,
        }
    }

    /// Make it the first stage: its input is `input(microbatch)`.
    pub fn with_input(
        mut self,
        input: impl Fn(&D) -> candle_core::Result<CandleTensor> + 'static,
    ) -> Self {
        self.input = Some(Box::new(input));
        self
    }

    /// Make it the last stage: its loss is `loss(output, microbatch, loss_scale)`.
    pub fn with_loss(
        mut self,
        loss: impl Fn(&CandleTensor, &D, f32) -> candle_core::Result<CandleTensor> + 'static,
    ) -> Self {
        self.loss = Some(Box::new(loss));
        self
    }

    fn num_params(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Add one backward's gradients into the stage's accumulators.
    fn accumulate(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        for ((_, var), acc) in self.vars.iter().zip(&mut self.grads) {
            if let Some(g) = grads.get(var.as_tensor()) {
                *acc = Some(match acc.take() {
                    Some(a) => (a + g)?,
                    None => g.detach(),
                });
            }
        }
        Ok(())
    }
}

/// A host tensor as a candle one (f32, CPU).
pub fn to_candle(t: &Tensor) -> candle_core::Result<CandleTensor> {
    CandleTensor::from_slice(t.data(), t.shape(), &Device::Cpu)
}

/// A candle tensor as a host one (converted to f32).
pub fn to_host(t: &CandleTensor) -> Result<Tensor, ModuleError> {
    let data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(Tensor::new(t.dims(), data)?)
}

impl<D> StageModule for CandleStage<D> {
    type Tensor = Tensor;
    type Data = D;
    type Stash = CandleStash;
    type WeightStash = ();

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, D>,
        input: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, CandleStash), ModuleError> {
        let (x, input) = match input {
            Some(t) => {
                let v = Var::from_tensor(&to_candle(&t)?)?;
                (v.as_tensor().clone(), Some(v))
            }
            None => (
                self.input.as_ref().ok_or(CandleStageError::NoInput)?(mb.data)?,
                None,
            ),
        };
        let y = self.module.forward(&x)?;
        let Some(loss) = &self.loss else {
            let out = Output::Hidden(to_host(&y)?);
            return Ok((
                out,
                CandleStash {
                    input,
                    out: y,
                    is_loss: false,
                },
            ));
        };
        let l = loss(&y, mb.data, mb.loss_scale)?;
        if !l.dims().is_empty() {
            return Err(CandleStageError::LossNotScalar(l.dims().to_vec()).into());
        }
        let value = l.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        Ok((
            Output::Loss(value),
            CandleStash {
                input,
                out: l,
                is_loss: true,
            },
        ))
    }

    fn splits_backward(&self) -> bool {
        false
    }

    fn backward(
        &mut self,
        stash: CandleStash,
        grad_out: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<Option<Tensor>, ModuleError> {
        // The gradient of sum(out * g) is g pulled back through the stage: a VJP.
        let objective = match (grad_out, stash.is_loss) {
            (None, true) => stash.out,
            (Some(g), false) => (stash.out * to_candle(&g)?)?.sum_all()?,
            (None, false) => return Err(CandleStageError::Gradient("no output gradient").into()),
            (Some(_), true) => {
                return Err(CandleStageError::Gradient("the last stage got a gradient").into())
            }
        };
        let grads = objective.backward()?;
        self.accumulate(&grads)?;
        let Some(x) = stash.input else {
            return Ok(None);
        };
        let dx = match grads.get(x.as_tensor()) {
            Some(g) => to_host(g)?,
            None => Tensor::zeros(x.dims()),
        };
        Ok(Some(dx))
    }

    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        if self.vars.is_empty() {
            return Ok(None);
        }
        let mut flat = Vec::with_capacity(self.num_params());
        for ((_, var), acc) in self.vars.iter().zip(&self.grads) {
            match acc {
                Some(g) => flat.extend(to_host(g)?.into_data()),
                None => flat.resize(flat.len() + var.elem_count(), 0.0),
            }
        }
        Ok(Some(Tensor::new(&[flat.len()], flat)?))
    }

    fn set_flat_grads(&mut self, grads: Tensor) -> Result<(), ModuleError> {
        let expected = self.num_params();
        if grads.numel() != expected {
            let got = grads.numel();
            return Err(CandleStageError::GradLength { expected, got }.into());
        }
        let mut rest = grads.data();
        for ((_, var), acc) in self.vars.iter().zip(&mut self.grads) {
            let (mine, tail) = rest.split_at(var.elem_count());
            *acc = Some(CandleTensor::from_slice(mine, var.shape(), &Device::Cpu)?);
            rest = tail;
        }
        Ok(())
    }

    /// Candle's [`AdamW`] (made from `cfg` on the first step) over the accumulated
    /// gradients, then zero them. Candle decays every variable by `weight_decay`.
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        if self.vars.is_empty() {
            return Ok(());
        }
        let mut store = GradStore::default();
        for ((_, var), acc) in self.vars.iter().zip(&mut self.grads) {
            if let Some(g) = acc.take() {
                store.insert(var.as_tensor(), g);
            }
        }
        let opt = match &mut self.adamw {
            Some(opt) => opt,
            slot => slot.insert(AdamW::new(
                self.vars.iter().map(|(_, v)| v.clone()).collect(),
                adamw_params(cfg),
            )?),
        };
        Ok(opt.step(&store)?)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        if self.vars.is_empty() {
            return Ok(None);
        }
        let mut flat = Vec::with_capacity(self.num_params());
        for (_, var) in &self.vars {
            flat.extend(to_host(var.as_tensor())?.into_data());
        }
        Ok(Some(flat))
    }
}

/// Candle's AdamW settings for pipewright's.
pub fn adamw_params(cfg: &AdamWConfig) -> ParamsAdamW {
    ParamsAdamW {
        lr: f64::from(cfg.lr),
        beta1: f64::from(cfg.beta1),
        beta2: f64::from(cfg.beta2),
        eps: f64::from(cfg.eps),
        weight_decay: f64::from(cfg.weight_decay),
    }
}
