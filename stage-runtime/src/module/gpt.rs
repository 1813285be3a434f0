//! [`GptModule`]: the reference GPT's stage as a [`StageModule`], on any backend.

use std::ops::Range;
use std::sync::Arc;

use pipewright_kernels::gpt::{
    GptConfig, GptStage, Keep, Microbatch as GptMicrobatch, Stash, WeightStash,
};
use pipewright_kernels::layers::{TpReduce, TpShard};
use pipewright_kernels::optim::{AdamWConfig, DeviceAdamW, ShardedAdamW};
use pipewright_kernels::{params, Backend, Cpu};
use pipewright_schedule::Recompute;

use super::{first_non_finite, MicrobatchData, ModuleError, Output, ParamName, StageModule};
use crate::data::TokenBatch;

/// One stage (and TP shard) of the reference GPT on a backend: the CPU by default, a GPU with
/// `B = CudaBackend` (feature `cuda`), where activations, gradients, the flat gradients of
/// the data-parallel all-reduce and the AdamW moments all stay on the device.
pub struct GptModule<B: Backend = Cpu> {
    /// The kernels' stage.
    pub stage: GptStage<B>,
    adamw: Option<DeviceAdamW<B>>,
    keep: Keep,
    /// ZeRO-1: the moments of this replica's range only.
    shard: Option<ShardedAdamW<B>>,
}

impl GptModule {
    /// Stage `stage` of `stages` on the CPU, TP shard `tp`, initialised from `seed`.
    pub fn new(
        cfg: &GptConfig,
        seed: u64,
        stage: usize,
        stages: usize,
        tp: TpShard,
    ) -> Result<Self, ModuleError> {
        Self::on(&Arc::new(Cpu), cfg, seed, stage, stages, tp)
    }
}

impl<B: Backend> GptModule<B> {
    /// Stage `stage` of `stages` on `backend`, with the same weights as on the CPU.
    pub fn on(
        backend: &Arc<B>,
        cfg: &GptConfig,
        seed: u64,
        stage: usize,
        stages: usize,
        tp: TpShard,
    ) -> Result<Self, ModuleError> {
        Ok(GptModule {
            stage: GptStage::on(backend, cfg, seed, stage, stages, tp)?,
            adamw: None,
            keep: Keep::All,
            shard: None,
        })
    }
}

impl<B: Backend> GptModule<B> {
    fn microbatch<'a>(&self, mb: &MicrobatchData<'a, TokenBatch>) -> GptMicrobatch<'a> {
        GptMicrobatch {
            tokens: &mb.data.tokens,
            targets: &mb.data.targets,
            seq: self.stage.config().seq_len,
            loss_scale: mb.loss_scale,
        }
    }
}

impl<B: Backend> StageModule for GptModule<B> {
    type Tensor = B::Storage;
    type Data = TokenBatch;
    type Stash = Stash<B>;
    type WeightStash = WeightStash<B>;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, TokenBatch>,
        input: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(Output<B::Storage>, Stash<B>), ModuleError> {
        let gmb = self.microbatch(mb);
        Ok(self.stage.forward_keeping(&gmb, input, tp, self.keep)?)
    }

    /// Full keeps the stage input, selective all but the attention probabilities.
    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        self.keep = match policy {
            Recompute::None => Keep::All,
            Recompute::Full => Keep::Input,
            Recompute::Selective => Keep::NoAttentionCore,
            Recompute::Every(n) => Keep::FirstBlocksFrom(n as usize),
        };
        Ok(())
    }

    fn recompute(
        &mut self,
        mb: &MicrobatchData<'_, TokenBatch>,
        stash: Stash<B>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<Stash<B>, ModuleError> {
        let gmb = self.microbatch(mb);
        Ok(self.stage.recompute(&gmb, stash, tp)?)
    }

    fn backward_input(
        &mut self,
        stash: Stash<B>,
        grad_out: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(Option<B::Storage>, WeightStash<B>), ModuleError> {
        Ok(self.stage.backward_input(stash, grad_out, tp)?)
    }

    fn backward_weight(&mut self, ws: WeightStash<B>) -> Result<(), ModuleError> {
        Ok(self.stage.backward_weight(ws)?)
    }

    /// The stage's parameters as the kernels name them (`blocks.3.attn.qkv.weight`), so
    /// the replica check and step 0's unused-parameter check name them.
    fn parameter_names(&self) -> Option<Vec<ParamName>> {
        use pipewright_kernels::layers::Parameters;
        let mut names = Vec::new();
        self.stage
            .visit(&mut |p| names.push(ParamName::new(p.name.clone(), p)));
        Some(names)
    }

    /// The values of parameters named `*.experts.*`, in runs of consecutive ones: a
    /// mixture's experts are contiguous in the stage's visit order, between its router and its
    /// shared expert.
    fn expert_ranges(&self) -> Option<Vec<Range<usize>>> {
        let mut runs: Vec<Range<usize>> = Vec::new();
        let mut at = 0;
        for n in self.parameter_names()? {
            let next = at + n.numel;
            if n.name.contains(".experts.") {
                match runs.last_mut() {
                    Some(r) if r.end == at => r.end = next,
                    _ => runs.push(at..next),
                }
            }
            at = next;
        }
        Some(runs)
    }

    /// The tokens and targets, hashed: every rank of a replica must hold the same.
    fn data_fingerprint(&self, data: &TokenBatch) -> Result<Option<u64>, ModuleError> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        data.hash(&mut h);
        Ok(Some(h.finish()))
    }

    fn reduce_tp_grads(&mut self, tp: &mut dyn TpReduce<B::Storage>) -> Result<(), ModuleError> {
        Ok(self.stage.reduce_sequence_parallel_grads(tp)?)
    }

    fn flat_grads(&mut self) -> Result<Option<B::Storage>, ModuleError> {
        Ok(Some(params::flat_grads(
            &**self.stage.backend(),
            &self.stage,
        )?))
    }

    /// Downloads the flat gradients (a copy on the CPU) and scans them: one pass over the
    /// parameters per step, against the many the step's compute makes.
    fn non_finite_grad(&mut self) -> Result<Option<f32>, ModuleError>
    where
        B::Storage: 'static,
    {
        let be = Arc::clone(self.stage.backend());
        let flat = params::flat_grads(&*be, &self.stage)?;
        Ok(first_non_finite(be.download(&flat)?.data()))
    }

    fn set_flat_grads(&mut self, grads: B::Storage) -> Result<(), ModuleError> {
        let be = Arc::clone(self.stage.backend());
        Ok(params::set_flat_grads(&*be, &mut self.stage, &grads)?)
    }

    /// AdamW with its moments beside the parameters ([`DeviceAdamW`], which on the CPU
    /// matches the host `AdamW` to the bit), then zero the gradients.
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        let be = Arc::clone(self.stage.backend());
        let opt = match &mut self.adamw {
            Some(opt) => opt,
            slot => slot.insert(DeviceAdamW::new(&*be, &self.stage, *cfg)?),
        };
        opt.step(&*be, &mut self.stage)?;
        Ok(params::zero_grads(&*be, &mut self.stage)?)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        Ok(Some(params::flat_params_host(
            &**self.stage.backend(),
            &self.stage,
        )?))
    }

    fn shards_optimizer(&self) -> bool {
        true
    }

    /// [`ShardedAdamW`]: the update of [`DeviceAdamW`] value for value, so a ZeRO-1 run's
    /// parameters are the unsharded run's to the bit.
    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: B::Storage,
    ) -> Result<B::Storage, ModuleError> {
        let be = Arc::clone(self.stage.backend());
        let opt = match &mut self.shard {
            Some(opt) if opt.range() == range => opt,
            Some(opt) => {
                let had = opt.range();
                return Err(format!("optimizer shard moved from {had:?} to {range:?}").into());
            }
            slot => slot.insert(ShardedAdamW::new(&*be, &self.stage, range, *cfg)?),
        };
        let out = opt.step(&*be, &self.stage, &grads)?;
        params::zero_grads(&*be, &mut self.stage)?;
        Ok(out)
    }

    fn set_flat_params(&mut self, flat: B::Storage) -> Result<(), ModuleError> {
        let be = Arc::clone(self.stage.backend());
        Ok(params::set_flat_params(&*be, &mut self.stage, &flat)?)
    }

    /// The f32 moments held: the whole stage's, or its ZeRO-1 range's.
    fn optimizer_state_bytes(&self) -> usize {
        let whole = self.adamw.as_ref().map_or(0, DeviceAdamW::state_len);
        let shard = self.shard.as_ref().map_or(0, ShardedAdamW::state_len);
        4 * (whole + shard)
    }

    fn parameter_bytes(&self) -> usize {
        params::storage_bytes(&self.stage).0
    }

    fn gradient_bytes(&self) -> usize {
        params::storage_bytes(&self.stage).1
    }

    fn device_memory(&self) -> Result<Option<(usize, usize)>, ModuleError> {
        Ok(self.stage.backend().device_memory()?)
    }
}
