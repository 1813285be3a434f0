//! The end of an executor's step for its stages' gradients: the TP sums a stage's module
//! asks for, the DP all-reduce (or ZeRO-1's reduce-scatter, sharded step and all-gather)
//! started after each stage's last backward and finished before the optimizer, and the
//! NaN check.

use super::*;

impl<C, M> Executor<C, M>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    pub(super) fn non_finite(
        &self,
        step: u64,
        stage: u32,
        microbatch: Option<u32>,
        what: &'static str,
        value: f32,
    ) -> RuntimeError {
        RuntimeError::NonFinite {
            rank: self.mesh.rank(self.coord),
            coord: self.coord,
            step,
            stage,
            microbatch,
            what,
            value,
        }
    }

    /// Refuse non-finite gradients before the optimizer turns them into non-finite weights:
    /// one scan of each stage's (reduced) gradients per step. Stages in stage order, so every
    /// rank of a DP group (same reduced gradients) names the same stage.
    pub(super) fn check_grads(&mut self, step: u64) -> Result<(), RuntimeError> {
        let mut stages: Vec<u32> = self.modules.keys().copied().collect();
        stages.sort_unstable();
        for stage in stages {
            let module = self
                .modules
                .get_mut(&stage)
                .ok_or_else(|| RuntimeError::missing_stage(stage))?;
            let found = guard(|| module.non_finite_grad()).map_err(|e| {
                self.fail(step, None, format!("gradient check of stage {stage}: {e}"))
            })?;
            if let Some(v) = found {
                return Err(self.non_finite(step, stage, None, "gradient", v));
            }
        }
        Ok(())
    }

    /// The module's TP sum of partial gradients ([`StageModule::reduce_tp_grads`]), once its
    /// last backward of the step is done.
    pub(super) fn reduce_tp_grads(&mut self, step: u64, a: Action) -> Result<(), RuntimeError> {
        if self.tp_group.size() == 1 {
            return Ok(());
        }
        let Self {
            comm,
            tp_group,
            modules,
            ..
        } = self;
        let module = modules
            .get_mut(&a.stage)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        let mut tp = TpReducer::new(&**comm, tp_group, None);
        let r = guard(|| module.reduce_tp_grads(&mut tp));
        r.map_err(|e| self.fail(step, Some(a), e))
    }

    /// Start the data-parallel reduction of a stage's gradients (an all-reduce, or under
    /// ZeRO-1 a reduce-scatter); `None` when it has none.
    pub(super) fn start_grad_reduce(
        &mut self,
        step: u64,
        a: Action,
    ) -> Result<Option<Reduction<C::Pending>>, RuntimeError> {
        let module = self
            .modules
            .get_mut(&a.stage)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        let runs = match &self.ep_groups {
            Some(_) => module.expert_ranges().filter(|r| !r.is_empty()),
            None => None,
        };
        let Some(grads) = guard(|| module.flat_grads()).map_err(|e| self.fail(step, Some(a), e))?
        else {
            return Ok(None);
        };
        let (comm, group) = (&self.comm, &self.dp_group);
        let numel = comm.numel(&grads);
        if let (Some(runs), Some((_, edp))) = (runs, &self.ep_groups) {
            let started = (|| {
                let (dense, experts) = ep::split(&ep::to_host(grads)?, &runs)?;
                let dense = comm.start_all_reduce(group, ep::to_comm(dense)?, ReduceOp::Sum)?;
                let experts = comm.start_all_reduce(edp, ep::to_comm(experts)?, ReduceOp::Sum)?;
                Ok::<_, CommError>((dense, experts))
            })();
            let (pending, experts) = started.map_err(|e| self.fail(step, Some(a), e))?;
            return Ok(Some(Reduction {
                stage: a.stage,
                numel,
                pending,
                experts: Some((experts, runs)),
            }));
        }
        let pending = if self.sharded {
            comm.start_reduce_scatter(group, grads, ReduceOp::Sum)
        } else {
            comm.start_all_reduce(group, grads, ReduceOp::Sum)
        };
        let pending = pending.map_err(|e| self.fail(step, Some(a), e))?;
        Ok(Some(Reduction {
            stage: a.stage,
            numel,
            pending,
            experts: None,
        }))
    }

    /// Wait for gradient reductions, then step every stage's optimizer (under ZeRO-1, the
    /// reduced stages' shards, whose updated values are then all-gathered).
    pub(super) fn finish_step(
        &mut self,
        step: u64,
        pending: Vec<Reduction<C::Pending>>,
        mem: &mut Meter,
    ) -> Result<(), RuntimeError> {
        let cfg = self.adamw;
        // All-reduced gradients are set back first, so that the NaN check sees the sums the
        // optimizer will use. Under ZeRO-1 a module keeps only its own (unreduced) gradients:
        // the check sees those on every replica, so any replica that brings a non-finite
        // value stops the run before the sharded step.
        let (sharded, reduced): (Vec<_>, Vec<_>) = pending.into_iter().partition(|_| self.sharded);
        for r in reduced {
            let stage = r.stage;
            self.reduced_grads(r, mem).map_err(|e| {
                self.fail(
                    step,
                    None,
                    format!("gradient all-reduce of stage {stage}: {e}"),
                )
            })?;
        }
        if self.check_finite {
            self.check_grads(step)?;
        }
        self.check_unused(step)?;
        let mut stepped = Vec::new();
        for r in sharded {
            let stage = r.stage;
            stepped.push(stage);
            self.sharded_step(r, &cfg, mem).map_err(|e| {
                let what = "ZeRO-1 reduce-scatter, optimizer step and all-gather";
                self.fail(step, None, format!("{what} of stage {stage}: {e}"))
            })?;
        }
        for (stage, module) in self.modules.iter_mut() {
            if stepped.contains(stage) {
                continue;
            }
            let before = module.optimizer_state_bytes();
            if let Err(e) = guard(|| module.optimizer_step(&cfg)) {
                let message = match unimplemented_method(&e) {
                    Some(method) => format!("stage {stage}: {}", needed_for(method, self.mesh.dp)),
                    None => format!("optimizer of stage {stage}: {e}"),
                };
                let rank = self.mesh.rank(self.coord);
                return Err(RuntimeError::device(rank, self.coord, step, None, message));
            }
            // AdamW's state appears on the first step: counted from then on.
            let grown = module.optimizer_state_bytes().saturating_sub(before);
            mem.add(Category::OptimizerState, grown as u64);
        }
        Ok(())
    }

    /// A stage's all-reduced gradients, waited for and set back.
    pub(super) fn reduced_grads(
        &mut self,
        r: Reduction<C::Pending>,
        mem: &mut Meter,
    ) -> Result<(), ModuleError> {
        let mut t = self.comm.wait_all_reduce(r.pending)?;
        if let Some((experts, runs)) = r.experts {
            let experts = ep::to_host(self.comm.wait_all_reduce(experts)?)?;
            t = ep::to_comm(ep::splice(&ep::to_host(t)?, &experts, &runs)?)?;
        }
        let module = self
            .modules
            .get_mut(&r.stage)
            .ok_or_else(|| RuntimeError::missing_stage(r.stage))?;
        guard(|| module.set_flat_grads(t))?;
        mem.sub(Category::Buffers, F32 * r.numel as u64);
        Ok(())
    }

    /// ZeRO-1 for one stage: this rank's shard of the reduced gradients, AdamW on that
    /// shard, every replica's updated shard gathered into the stage's parameters.
    pub(super) fn sharded_step(
        &mut self,
        r: Reduction<C::Pending>,
        cfg: &AdamWConfig,
        mem: &mut Meter,
    ) -> Result<(), ModuleError> {
        let (comm, group) = (&self.comm, &self.dp_group);
        let grads = comm.wait_reduce_scatter(r.pending)?;
        let pos = group
            .position(self.mesh.rank(self.coord))
            .ok_or("this rank is not in its data-parallel group")?;
        let range = shard_range(r.numel, group.size(), pos);
        let (whole, shard_bytes) = (F32 * r.numel as u64, F32 * range.len() as u64);
        // The flat gradients gave way to this rank's reduced shard.
        mem.sub(Category::Buffers, whole);
        mem.add(Category::Buffers, shard_bytes);
        let module = self
            .modules
            .get_mut(&r.stage)
            .ok_or_else(|| RuntimeError::missing_stage(r.stage))?;
        let before = module.optimizer_state_bytes();
        let shard = guard(|| module.optimizer_step_shard(cfg, range, grads))?;
        let grown = module.optimizer_state_bytes().saturating_sub(before);
        mem.add(Category::OptimizerState, grown as u64);
        let values = comm.all_gather_shards(group, shard, r.numel)?;
        // Every replica's updated shard, gathered; the rank's own shard went into it.
        mem.add(Category::Buffers, whole);
        mem.sub(Category::Buffers, shard_bytes);
        guard(|| module.set_flat_params(values))?;
        mem.sub(Category::Buffers, whole);
        Ok(())
    }
}
