//! A boxed module is a module, so a stage list can mix module types behind
//! `Box<dyn StageModule<...>>` (and the runtime compiles its executor once for such a box).
//! Every method goes to the boxed module, its defaults included, so a method it does not
//! implement is still refused in its name.

use std::ops::Range;

use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_schedule::Recompute;

use crate::module::{MicrobatchData, ModuleError, Output, ParamName, StageModule};

// A method left out here would run the trait's default, not the boxed module's own.
#[deny(clippy::missing_trait_methods)]
impl<S: StageModule + ?Sized> StageModule for Box<S> {
    type Tensor = S::Tensor;
    type Data = S::Data;
    type Stash = S::Stash;
    type WeightStash = S::WeightStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, S::Data>,
        input: Option<S::Tensor>,
        tp: &mut dyn TpReduce<S::Tensor>,
    ) -> Result<(Output<S::Tensor>, S::Stash), ModuleError> {
        (**self).forward(mb, input, tp)
    }

    fn splits_backward(&self) -> bool {
        (**self).splits_backward()
    }

    fn backward_input(
        &mut self,
        stash: S::Stash,
        grad_out: Option<S::Tensor>,
        tp: &mut dyn TpReduce<S::Tensor>,
    ) -> Result<(Option<S::Tensor>, S::WeightStash), ModuleError> {
        (**self).backward_input(stash, grad_out, tp)
    }

    fn backward_weight(&mut self, stash: S::WeightStash) -> Result<(), ModuleError> {
        (**self).backward_weight(stash)
    }

    fn backward(
        &mut self,
        stash: S::Stash,
        grad_out: Option<S::Tensor>,
        tp: &mut dyn TpReduce<S::Tensor>,
    ) -> Result<Option<S::Tensor>, ModuleError> {
        (**self).backward(stash, grad_out, tp)
    }

    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        (**self).set_recompute(policy)
    }

    fn recompute(
        &mut self,
        mb: &MicrobatchData<'_, S::Data>,
        stash: S::Stash,
        tp: &mut dyn TpReduce<S::Tensor>,
    ) -> Result<S::Stash, ModuleError> {
        (**self).recompute(mb, stash, tp)
    }

    fn flat_grads(&mut self) -> Result<Option<S::Tensor>, ModuleError> {
        (**self).flat_grads()
    }

    fn non_finite_grad(&mut self) -> Result<Option<f32>, ModuleError>
    where
        S::Tensor: 'static,
    {
        (**self).non_finite_grad()
    }

    fn set_flat_grads(&mut self, grads: S::Tensor) -> Result<(), ModuleError> {
        (**self).set_flat_grads(grads)
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        (**self).optimizer_step(cfg)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        (**self).flat_params()
    }

    fn expert_ranges(&self) -> Option<Vec<Range<usize>>> {
        (**self).expert_ranges()
    }

    fn check_tp(&self, tp: usize) -> Result<(), ModuleError> {
        (**self).check_tp(tp)
    }

    fn parameter_names(&self) -> Option<Vec<ParamName>> {
        (**self).parameter_names()
    }

    fn data_fingerprint(&self, data: &S::Data) -> Result<Option<u64>, ModuleError> {
        (**self).data_fingerprint(data)
    }

    fn prediction_shape(&self) -> Option<Vec<usize>> {
        (**self).prediction_shape()
    }

    fn target_fingerprint(
        &self,
        data: &S::Data,
        shape: &[usize],
    ) -> Result<Option<u64>, ModuleError> {
        (**self).target_fingerprint(data, shape)
    }

    fn shards_optimizer(&self) -> bool {
        (**self).shards_optimizer()
    }

    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: S::Tensor,
    ) -> Result<S::Tensor, ModuleError> {
        (**self).optimizer_step_shard(cfg, range, grads)
    }

    fn set_flat_params(&mut self, params: S::Tensor) -> Result<(), ModuleError> {
        (**self).set_flat_params(params)
    }

    fn optimizer_state_bytes(&self) -> usize {
        (**self).optimizer_state_bytes()
    }

    fn parameter_bytes(&self) -> usize {
        (**self).parameter_bytes()
    }

    fn gradient_bytes(&self) -> usize {
        (**self).gradient_bytes()
    }

    fn device_memory(&self) -> Result<Option<(usize, usize)>, ModuleError> {
        (**self).device_memory()
    }

    fn reduce_tp_grads(&mut self, tp: &mut dyn TpReduce<S::Tensor>) -> Result<(), ModuleError> {
        (**self).reduce_tp_grads(tp)
    }
}
