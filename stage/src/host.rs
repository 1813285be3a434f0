//! The parameter half of a [`StageModule`](crate::StageModule) on host tensors, for a
//! module whose parameters the kernels' [`Parameters`] visits: flat gradients for the
//! data-parallel all-reduce, AdamW, flat parameters. A user's module forwards its four
//! parameter methods here and writes only its forward and backward.

use std::ops::Range;

use pipewright_kernels::layers::Parameters;
use pipewright_kernels::optim::{AdamW, AdamWConfig, ShardedAdamW};
use pipewright_kernels::{params, Cpu, Tensor};

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

/// Each parameter's name (`Param::name`) and size, for
/// [`StageModule::parameter_names`](crate::StageModule::parameter_names).
pub fn parameter_names(p: &dyn Parameters) -> Option<Vec<crate::module::ParamName>> {
    let mut names = Vec::new();
    p.visit(&mut |q| names.push(crate::module::ParamName::new(q.name.clone(), q)));
    Some(names)
}

/// The parameters, flat, for [`StageModule::flat_params`](crate::StageModule::flat_params).
pub fn flat_params(p: &dyn Parameters) -> Result<Option<Vec<f32>>, ModuleError> {
    Ok(Some(p.flat_params()))
}

/// Replace the parameter values, for
/// [`StageModule::set_flat_params`](crate::StageModule::set_flat_params) (ZeRO-1).
pub fn set_flat_params(p: &mut dyn Parameters, values: Tensor) -> Result<(), ModuleError> {
    Ok(params::set_flat_params(&Cpu, p, &values)?)
}

/// AdamW state made on the first step, for
/// [`StageModule::optimizer_step`](crate::StageModule::optimizer_step), or under ZeRO-1 for
/// [`StageModule::optimizer_step_shard`](crate::StageModule::optimizer_step_shard) (the
/// moments of one range only).
#[derive(Debug, Default)]
pub struct HostAdamW {
    whole: Option<AdamW>,
    shard: Option<ShardedAdamW<Cpu>>,
}

impl HostAdamW {
    /// One AdamW step of `range` of `p`'s flat parameters from `grads` (that range's reduced
    /// gradients), then zero the gradients; returns the range's updated values.
    pub fn step_shard(
        &mut self,
        p: &mut dyn Parameters,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: Tensor,
    ) -> Result<Tensor, ModuleError> {
        let opt = match &mut self.shard {
            Some(opt) if opt.range() == range => opt,
            Some(opt) => {
                let had = opt.range();
                return Err(format!("optimizer shard moved from {had:?} to {range:?}").into());
            }
            slot => slot.insert(ShardedAdamW::new(&Cpu, &*p, range, *cfg)?),
        };
        let out = opt.step(&Cpu, &*p, &grads)?;
        p.zero_grad();
        Ok(out)
    }

    /// Bytes of the f32 moments held.
    pub fn state_bytes(&self) -> usize {
        let whole = self.whole.as_ref().map_or(0, AdamW::state_len);
        4 * (whole + self.shard.as_ref().map_or(0, ShardedAdamW::state_len))
    }

    /// One AdamW step of `p` from its accumulated gradients, then zero them.
    pub fn step(&mut self, p: &mut dyn Parameters, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        let opt = match &mut self.whole {
            Some(opt) => opt,
            slot => slot.insert(AdamW::new(p.num_params(), *cfg)),
        };
        opt.step(p)?;
        p.zero_grad();
        Ok(())
    }
}
