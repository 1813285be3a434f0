//! The parameter half of a [`StageModule`](crate::StageModule) on host tensors, for a
//! module whose parameters the kernels' [`Parameters`] visits: flat gradients for the
//! data-parallel all-reduce, AdamW, flat parameters. A user's module forwards its four
//! parameter methods here and writes only its forward and backward.

use pipewright_kernels::layers::Parameters;
use pipewright_kernels::optim::{AdamW, AdamWConfig};
use pipewright_kernels::Tensor;

use crate::module::ModuleError;

/// The gradients as one flat tensor, for [`StageModule::flat_grads`](crate::StageModule::flat_grads).
pub fn flat_grads(p: &dyn Parameters) -> Result<Option<Tensor>, ModuleError> {
    let g = p.flat_grads();
    Ok(Some(Tensor::new(&[g.len()], g)?))
}

/// Replace the gradients, for [`StageModule::set_flat_grads`](crate::StageModule::set_flat_grads).
pub fn set_flat_grads(p: &mut dyn Parameters, grads: Tensor) -> Result<(), ModuleError> {
    Ok(p.set_flat_grads(grads.data())?)
}

/// The parameters, flat, for [`StageModule::flat_params`](crate::StageModule::flat_params).
pub fn flat_params(p: &dyn Parameters) -> Result<Option<Vec<f32>>, ModuleError> {
    Ok(Some(p.flat_params()))
}

/// AdamW state made on the first step, for
/// [`StageModule::optimizer_step`](crate::StageModule::optimizer_step).
#[derive(Clone, Debug, Default)]
pub struct HostAdamW(Option<AdamW>);

impl HostAdamW {
    /// One AdamW step of `p` from its accumulated gradients, then zero them.
    pub fn step(&mut self, p: &mut dyn Parameters, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        let opt = match &mut self.0 {
            Some(opt) => opt,
            slot => slot.insert(AdamW::new(p.num_params(), *cfg)),
        };
        opt.step(p)?;
        p.zero_grad();
        Ok(())
    }
}
