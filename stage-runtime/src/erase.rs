//! A user's stage module behind one type, so that [`run`](crate::run::run) compiles the
//! executor once, in this crate, whatever the module.
//!
//! The executor is generic over its module. Called with each user's module directly, every
//! module type (and every crate that calls `run`) compiled the whole executor again: the
//! runtime's own tests built it about a dozen times, a minute of a cold `cargo test`. Here a
//! module is boxed as an [`ErasedModule`], whose data and stashes are `dyn Any`: the executor
//! is instantiated for that one type, and what each module adds is this file's forwarding.
//! The cost is a virtual call and a box per stash, nanoseconds beside an action's compute.

use std::any::Any;
use std::ops::Range;

use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Footprint;
use pipewright_schedule::Recompute;

use crate::module::{MicrobatchData, ModuleError, Output, ParamName, StageModule};

/// One microbatch of any module's data.
pub type AnyData = Box<dyn Any>;

/// Any module's stash, with its bytes.
pub struct AnyStash(Box<dyn StashObject>);

/// What the executor asks of a stash: its bytes, and (in the module) its own type back.
trait StashObject {
    fn bytes(&self) -> usize;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<S: Footprint + 'static> StashObject for S {
    fn bytes(&self) -> usize {
        Footprint::bytes(self)
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Footprint for AnyStash {
    fn bytes(&self) -> usize {
        self.0.bytes()
    }
}

impl AnyStash {
    fn new<S: Footprint + 'static>(s: S) -> Self {
        AnyStash(Box::new(s))
    }

    /// The stash as the module made it. Another type is the runtime's bug, not the user's,
    /// and is said as such rather than a panic.
    fn take<S: 'static>(self) -> Result<S, ModuleError> {
        self.0
            .into_any()
            .downcast::<S>()
            .map(|s| *s)
            .map_err(|_| mixed("a stash"))
    }
}

fn mixed(what: &str) -> ModuleError {
    format!("internal error: {what} of another stage's type reached this stage").into()
}

/// A module of any type whose tensors are `T`.
pub type ErasedModule<T> =
    Box<dyn StageModule<Tensor = T, Data = AnyData, Stash = AnyStash, WeightStash = AnyStash>>;

/// `module` as an [`ErasedModule`].
pub fn erase<M>(module: M) -> ErasedModule<M::Tensor>
where
    M: StageModule + 'static,
    M::Tensor: 'static,
    M::Data: 'static,
    M::Stash: 'static,
    M::WeightStash: 'static,
{
    Box::new(Erase(module))
}

/// One microbatch of `D` as the executor carries it.
pub fn erase_data<D: 'static>(data: D) -> AnyData {
    Box::new(data)
}

/// `M` with its data and stashes as `dyn Any`.
struct Erase<M>(M);

/// The module's own data.
fn own<D: 'static>(data: &AnyData) -> Result<&D, ModuleError> {
    data.downcast_ref::<D>().ok_or_else(|| mixed("data"))
}

/// `mb` with the module's own data.
fn typed<'a, D: 'static>(
    mb: &MicrobatchData<'a, AnyData>,
) -> Result<MicrobatchData<'a, D>, ModuleError> {
    Ok(MicrobatchData {
        index: mb.index,
        data: own(mb.data)?,
        loss_scale: mb.loss_scale,
    })
}

// A method left out here would run the trait's default, not the module's own.
#[deny(clippy::missing_trait_methods)]
impl<M> StageModule for Erase<M>
where
    M: StageModule,
    M::Tensor: 'static,
    M::Data: 'static,
    M::Stash: 'static,
    M::WeightStash: 'static,
{
    type Tensor = M::Tensor;
    type Data = AnyData;
    type Stash = AnyStash;
    type WeightStash = AnyStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, AnyData>,
        input: Option<M::Tensor>,
        tp: &mut dyn TpReduce<M::Tensor>,
    ) -> Result<(Output<M::Tensor>, AnyStash), ModuleError> {
        let (out, stash) = self.0.forward(&typed(mb)?, input, tp)?;
        Ok((out, AnyStash::new(stash)))
    }

    fn splits_backward(&self) -> bool {
        self.0.splits_backward()
    }

    fn backward_input(
        &mut self,
        stash: AnyStash,
        grad_out: Option<M::Tensor>,
        tp: &mut dyn TpReduce<M::Tensor>,
    ) -> Result<(Option<M::Tensor>, AnyStash), ModuleError> {
        let (g, w) = self.0.backward_input(stash.take()?, grad_out, tp)?;
        Ok((g, AnyStash::new(w)))
    }

    fn backward_weight(&mut self, stash: AnyStash) -> Result<(), ModuleError> {
        self.0.backward_weight(stash.take()?)
    }

    fn backward(
        &mut self,
        stash: AnyStash,
        grad_out: Option<M::Tensor>,
        tp: &mut dyn TpReduce<M::Tensor>,
    ) -> Result<Option<M::Tensor>, ModuleError> {
        self.0.backward(stash.take()?, grad_out, tp)
    }

    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        self.0.set_recompute(policy)
    }

    fn recompute(
        &mut self,
        mb: &MicrobatchData<'_, AnyData>,
        stash: AnyStash,
        tp: &mut dyn TpReduce<M::Tensor>,
    ) -> Result<AnyStash, ModuleError> {
        let s = self.0.recompute(&typed(mb)?, stash.take()?, tp)?;
        Ok(AnyStash::new(s))
    }

    fn flat_grads(&mut self) -> Result<Option<M::Tensor>, ModuleError> {
        self.0.flat_grads()
    }

    fn non_finite_grad(&mut self) -> Result<Option<f32>, ModuleError> {
        self.0.non_finite_grad()
    }

    fn set_flat_grads(&mut self, grads: M::Tensor) -> Result<(), ModuleError> {
        self.0.set_flat_grads(grads)
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.optimizer_step(cfg)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        self.0.flat_params()
    }

    fn expert_ranges(&self) -> Option<Vec<Range<usize>>> {
        self.0.expert_ranges()
    }

    fn check_tp(&self, tp: usize) -> Result<(), ModuleError> {
        self.0.check_tp(tp)
    }

    fn parameter_names(&self) -> Option<Vec<ParamName>> {
        self.0.parameter_names()
    }

    fn data_fingerprint(&self, data: &AnyData) -> Result<Option<u64>, ModuleError> {
        self.0.data_fingerprint(own(data)?)
    }

    fn prediction_shape(&self) -> Option<Vec<usize>> {
        self.0.prediction_shape()
    }

    fn target_fingerprint(
        &self,
        data: &AnyData,
        shape: &[usize],
    ) -> Result<Option<u64>, ModuleError> {
        self.0.target_fingerprint(own(data)?, shape)
    }

    fn shards_optimizer(&self) -> bool {
        self.0.shards_optimizer()
    }

    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: M::Tensor,
    ) -> Result<M::Tensor, ModuleError> {
        self.0.optimizer_step_shard(cfg, range, grads)
    }

    fn set_flat_params(&mut self, params: M::Tensor) -> Result<(), ModuleError> {
        self.0.set_flat_params(params)
    }

    fn optimizer_state_bytes(&self) -> usize {
        self.0.optimizer_state_bytes()
    }

    fn parameter_bytes(&self) -> usize {
        self.0.parameter_bytes()
    }

    fn gradient_bytes(&self) -> usize {
        self.0.gradient_bytes()
    }

    fn device_memory(&self) -> Result<Option<(usize, usize)>, ModuleError> {
        self.0.device_memory()
    }

    fn reduce_tp_grads(&mut self, tp: &mut dyn TpReduce<M::Tensor>) -> Result<(), ModuleError> {
        self.0.reduce_tp_grads(tp)
    }
}
