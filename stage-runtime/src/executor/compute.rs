//! One compute action of a device's row (F, B, I, W or R) on its stage's module: where its
//! inputs come from (a receive or a hand-off on this device), what it stashes and frees, and
//! where its outputs go.

use super::*;

impl<C, M> Executor<C, M>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    pub(super) fn compute(
        &mut self,
        step: u64,
        a: Action,
        batch: &StepBatch<M::Data>,
        st: &mut StateOf<M>,
    ) -> Result<(), RuntimeError> {
        let key = (a.stage, a.microbatch);
        let stages = self.tt.num_stages();
        let here = self.coord.pp as u32;
        let mb = batch
            .microbatches
            .get(a.microbatch as usize)
            .ok_or_else(|| self.fail(step, Some(a), "no data for this microbatch"))?;
        let data = MicrobatchData {
            index: a.microbatch,
            data: mb,
            loss_scale: batch.loss_scale,
        };
        let Self {
            comm,
            tp_group,
            modules,
            tt,
            recompute,
            whole,
            handoffs,
            check_finite,
            ..
        } = self;
        let check_finite = *check_finite;
        let shapes = handoffs
            .get_mut(a.stage as usize)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        let module = modules
            .get_mut(&a.stage)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        let mut tp = TpReducer {
            comm: &**comm,
            group: tp_group,
        };
        let tensor_bytes = |t: &C::Tensor| F32 * comm.numel(t) as u64;
        let mut loss = None;
        let mut reached = false;
        let result: Result<(), ModuleError> = guard(|| {
            match a.kind {
                ActionKind::F => {
                    let input = if a.stage == 0 {
                        None
                    } else {
                        Some(take(&mut st.fwd_in, key, "input")?)
                    };
                    if let Some(x) = &input {
                        shapes.input(x);
                    }
                    // The input moves into the stash (or is dropped): no longer a buffer.
                    let held = input.as_ref().map_or(0, tensor_bytes);
                    st.mem.sub(Category::Buffers, held);
                    st.live += 1;
                    st.peak = st.peak.max(st.live);
                    let policy = recompute.get(&a.stage).filter(|_| whole.contains(&key));
                    if policy.is_some() {
                        module.set_recompute(Recompute::None)?;
                        st.rebuilt.insert(key);
                    }
                    let (out, stash) = module.forward(&data, input, &mut tp)?;
                    if let Some(&policy) = policy {
                        module.set_recompute(policy)?;
                    }
                    let kept = stash.bytes();
                    st.keep_bytes(kept);
                    st.kept = st.kept.max(kept as u64);
                    st.stash.insert(key, stash);
                    let last = a.stage + 1 == stages;
                    match out {
                        Output::Loss(l) if last => {
                            *st.loss.get_or_insert(0.0) += l;
                            loss = Some(l);
                        }
                        Output::Loss(_) => {
                            let msg = format!(
                                "stage {} returned a loss, but only the last stage ({}) may: \
                                 the others return Output::Hidden for the next stage",
                                a.stage,
                                stages - 1
                            );
                            return Err(msg.into());
                        }
                        Output::Hidden(t) if !last => {
                            shapes.output(a.stage, &t, check_finite)?;
                            st.mem.add(Category::Buffers, tensor_bytes(&t));
                            if tt.stage_device[a.stage as usize + 1] == here {
                                st.fwd_in.insert((a.stage + 1, a.microbatch), t);
                            } else {
                                st.outbox.insert((a.stage, a.microbatch, true), t);
                            }
                        }
                        Output::Hidden(_) => {
                            let msg = format!(
                                "stage {} is the last stage, but it returned activations \
                                 (Output::Hidden), not a loss",
                                a.stage
                            );
                            return Err(msg.into());
                        }
                    }
                }
                ActionKind::B | ActionKind::I => {
                    let grad_out = if a.stage + 1 == stages {
                        None
                    } else {
                        Some(take(&mut st.bwd_in, key, "output gradient")?)
                    };
                    let held = grad_out.as_ref().map_or(0, tensor_bytes);
                    st.mem.sub(Category::Buffers, held);
                    reached = step == 0 && grad_out.as_ref().is_some_and(first_step::nonzero);
                    let mut stash = take(&mut st.stash, key, "stash (its forward)")?;
                    // The first backward rebuilds what the policy dropped, unless an R did.
                    if recompute.contains_key(&a.stage) && !st.rebuilt.remove(&key) {
                        stash = rebuild(module, &data, stash, &mut tp, st)?;
                    }
                    st.free_bytes(stash.bytes());
                    let grad_in = if a.kind == ActionKind::B {
                        let g = module.backward(stash, grad_out, &mut tp)?;
                        st.live -= 1;
                        g
                    } else {
                        let (g, ws) = module.backward_input(stash, grad_out, &mut tp)?;
                        st.keep_bytes(ws.bytes());
                        st.wstash.insert(key, ws);
                        g
                    };
                    if a.stage > 0 && grad_in.is_none() {
                        let msg = format!(
                            "stage {} returned no input gradient: every stage after the first \
                             returns the gradient of its input",
                            a.stage
                        );
                        return Err(msg.into());
                    }
                    if let (Some(g), true) = (grad_in, a.stage > 0) {
                        shapes.input_grad(a.stage, &g, check_finite)?;
                        st.mem.add(Category::Buffers, tensor_bytes(&g));
                        if tt.stage_device[a.stage as usize - 1] == here {
                            st.bwd_in.insert((a.stage - 1, a.microbatch), g);
                        } else {
                            st.outbox.insert((a.stage, a.microbatch, false), g);
                        }
                    }
                }
                ActionKind::R => {
                    let stash = take(&mut st.stash, key, "stash (its forward)")?;
                    let full = rebuild(module, &data, stash, &mut tp, st)?;
                    st.stash.insert(key, full);
                    st.rebuilt.insert(key);
                }
                ActionKind::W => {
                    let ws = take(&mut st.wstash, key, "weight stash (its I)")?;
                    st.free_bytes(ws.bytes());
                    module.backward_weight(ws)?;
                    st.live -= 1;
                }
                // Kinds this executor does not know are refused, never guessed at.
                other => return Err(format!("this runtime cannot execute {other} actions").into()),
            }
            Ok(())
        });
        result.map_err(|e| {
            let at = (self.mesh.rank(self.coord), self.coord, step);
            boundary_error(&e, at, a).unwrap_or_else(|| self.module_fail(step, Some(a), a.stage, e))
        })?;
        if step == 0 && (reached || loss.is_some_and(|l| l != 0.0)) {
            self.reached.insert(a.stage);
        }
        match loss {
            Some(l) if self.check_finite && !l.is_finite() => {
                Err(self.non_finite(step, a.stage, Some(a.microbatch), "loss", l))
            }
            _ => Ok(()),
        }
    }
}

/// Rebuild a stash its policy left slim, counting the bytes it grows by.
fn rebuild<M: StageModule>(
    module: &mut M,
    data: &MicrobatchData<'_, M::Data>,
    stash: M::Stash,
    tp: &mut dyn TpReduce<M::Tensor>,
    st: &mut StateOf<M>,
) -> Result<M::Stash, ModuleError> {
    let before = stash.bytes();
    let full = module.recompute(data, stash, tp)?;
    st.free_bytes(before);
    st.keep_bytes(full.bytes());
    Ok(full)
}

fn take<T>(
    map: &mut HashMap<(u32, u32), T>,
    key: (u32, u32),
    what: &str,
) -> Result<T, ModuleError> {
    map.remove(&key)
        .ok_or_else(|| format!("its {what} is missing").into())
}
