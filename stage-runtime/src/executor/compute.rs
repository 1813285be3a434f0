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
        let mb = batch
            .microbatches
            .get(a.microbatch as usize)
            .ok_or_else(|| self.fail(step, Some(a), "no data for this microbatch"))?;
        let data = MicrobatchData {
            index: a.microbatch,
            data: mb,
            loss_scale: batch.loss_scale,
        };
        let mut site = self.site(step, a, data)?;
        let result = guard(|| site.run(st));
        let (loss, reached) = result.map_err(|e| {
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

    /// The action's stage, borrowed from the executor for the action; an error if this device
    /// does not hold it.
    fn site<'a>(
        &'a mut self,
        step: u64,
        a: Action,
        data: MicrobatchData<'a, M::Data>,
    ) -> Result<Site<'a, C, M>, RuntimeError> {
        let stages = self.tt.num_stages();
        let here = self.coord.pp as u32;
        let Self {
            comm,
            tp_group,
            ep_groups,
            modules,
            tt,
            recompute,
            whole,
            handoffs,
            check_finite,
            ..
        } = self;
        let shapes = handoffs
            .get_mut(a.stage as usize)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        let module = modules
            .get_mut(&a.stage)
            .ok_or_else(|| RuntimeError::missing_stage(a.stage))?;
        Ok(Site {
            step,
            a,
            key: (a.stage, a.microbatch),
            stages,
            here,
            data,
            comm: &**comm,
            module,
            shapes,
            tp: TpReducer::new(&**comm, tp_group, ep_groups.as_ref()),
            tt,
            recompute,
            whole,
            check_finite: *check_finite,
        })
    }
}

/// What one compute action works on: its stage's module, hand-off shapes and TP group, and
/// what it needs of the timetable, borrowed from the executor for the action.
struct Site<'a, C: Communicator, M: StageModule<Tensor = C::Tensor>> {
    step: u64,
    a: Action,
    key: (u32, u32),
    stages: u32,
    /// This device's pipeline index.
    here: u32,
    data: MicrobatchData<'a, M::Data>,
    comm: &'a C,
    module: &'a mut M,
    shapes: &'a mut Handoffs,
    tp: TpReducer<'a, C>,
    tt: &'a Timetable,
    recompute: &'a HashMap<u32, Recompute>,
    /// The forwards that keep whole stashes under a recompute policy.
    whole: &'a HashSet<(u32, u32)>,
    check_finite: bool,
}

impl<C, M> Site<'_, C, M>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    /// Run the action on the module: the loss it produced (a forward on the last stage), and
    /// whether a nonzero gradient reached it (a backward in step 0).
    fn run(&mut self, st: &mut StateOf<M>) -> Result<(Option<f32>, bool), ModuleError> {
        match self.a.kind {
            ActionKind::F => self.forward(st).map(|loss| (loss, false)),
            ActionKind::B | ActionKind::I => self.backward(st).map(|reached| (None, reached)),
            ActionKind::R => self.recompute_stash(st).map(|()| (None, false)),
            ActionKind::W => self.weight(st).map(|()| (None, false)),
            // Kinds this executor does not know are refused, never guessed at.
            other => Err(format!("this runtime cannot execute {other} actions").into()),
        }
    }

    fn tensor_bytes(&self, t: &C::Tensor) -> u64 {
        F32 * self.comm.numel(t) as u64
    }

    /// F: take the input, run the forward, stash what it keeps, hand its output on.
    fn forward(&mut self, st: &mut StateOf<M>) -> Result<Option<f32>, ModuleError> {
        let (a, key) = (self.a, self.key);
        let input = if a.stage == 0 {
            None
        } else {
            Some(take(&mut st.fwd_in, key, "input")?)
        };
        if let Some(x) = &input {
            self.shapes.input(x);
        }
        // The input moves into the stash (or is dropped): no longer a buffer.
        let held = input.as_ref().map_or(0, |t| self.tensor_bytes(t));
        st.mem.sub(Category::Buffers, held);
        st.live += 1;
        st.peak = st.peak.max(st.live);
        let recompute = self.recompute;
        let policy = recompute
            .get(&a.stage)
            .filter(|_| self.whole.contains(&key));
        if policy.is_some() {
            self.module.set_recompute(Recompute::None)?;
            st.rebuilt.insert(key);
        }
        let (out, stash) = self.module.forward(&self.data, input, &mut self.tp)?;
        if let Some(&policy) = policy {
            self.module.set_recompute(policy)?;
        }
        let kept = stash.bytes();
        st.keep_bytes(kept);
        st.kept = st.kept.max(kept as u64);
        st.stash.insert(key, stash);
        self.hand_forward(out, st)
    }

    /// Where a forward's output goes: a loss into the step's sum (the last stage only),
    /// activations to the next stage, on this device or through the outbox.
    fn hand_forward(
        &mut self,
        out: Output<C::Tensor>,
        st: &mut StateOf<M>,
    ) -> Result<Option<f32>, ModuleError> {
        let (a, stages) = (self.a, self.stages);
        let last = a.stage + 1 == stages;
        match out {
            Output::Loss(l) if last => {
                *st.loss.get_or_insert(0.0) += l;
                Ok(Some(l))
            }
            Output::Loss(_) => {
                let msg = format!(
                    "stage {} returned a loss, but only the last stage ({}) may: \
                     the others return Output::Hidden for the next stage",
                    a.stage,
                    stages - 1
                );
                Err(msg.into())
            }
            Output::Hidden(t) if !last => {
                self.shapes.output(a.stage, &t, self.check_finite)?;
                st.mem.add(Category::Buffers, self.tensor_bytes(&t));
                if self.tt.stage_device[a.stage as usize + 1] == self.here {
                    st.fwd_in.insert((a.stage + 1, a.microbatch), t);
                } else {
                    st.outbox.insert((a.stage, a.microbatch, true), t);
                }
                Ok(None)
            }
            Output::Hidden(_) => {
                let msg = format!(
                    "stage {} is the last stage, but it returned activations \
                     (Output::Hidden), not a loss",
                    a.stage
                );
                Err(msg.into())
            }
        }
    }

    /// B or I: take the output gradient and the stash (rebuilt if its policy left it slim),
    /// run the backward, hand the input gradient on. Whether a nonzero gradient arrived.
    fn backward(&mut self, st: &mut StateOf<M>) -> Result<bool, ModuleError> {
        let (a, key) = (self.a, self.key);
        let grad_out = if a.stage + 1 == self.stages {
            None
        } else {
            Some(take(&mut st.bwd_in, key, "output gradient")?)
        };
        let held = grad_out.as_ref().map_or(0, |t| self.tensor_bytes(t));
        st.mem.sub(Category::Buffers, held);
        let reached = self.step == 0 && grad_out.as_ref().is_some_and(first_step::nonzero);
        let mut stash = take(&mut st.stash, key, "stash (its forward)")?;
        // The first backward rebuilds what the policy dropped, unless an R did.
        if self.recompute.contains_key(&a.stage) && !st.rebuilt.remove(&key) {
            stash = rebuild(self.module, &self.data, stash, &mut self.tp, st)?;
        }
        st.free_bytes(stash.bytes());
        let grad_in = if a.kind == ActionKind::B {
            let g = self.module.backward(stash, grad_out, &mut self.tp)?;
            st.live -= 1;
            g
        } else {
            let (g, ws) = self.module.backward_input(stash, grad_out, &mut self.tp)?;
            st.keep_bytes(ws.bytes());
            st.wstash.insert(key, ws);
            g
        };
        self.hand_backward(grad_in, st)?;
        Ok(reached)
    }

    /// Where an input gradient goes: to the previous stage, on this device or through the
    /// outbox; every stage after the first must return one.
    fn hand_backward(
        &mut self,
        grad_in: Option<C::Tensor>,
        st: &mut StateOf<M>,
    ) -> Result<(), ModuleError> {
        let a = self.a;
        if a.stage > 0 && grad_in.is_none() {
            let msg = format!(
                "stage {} returned no input gradient: every stage after the first \
                 returns the gradient of its input",
                a.stage
            );
            return Err(msg.into());
        }
        if let (Some(g), true) = (grad_in, a.stage > 0) {
            self.shapes.input_grad(a.stage, &g, self.check_finite)?;
            st.mem.add(Category::Buffers, self.tensor_bytes(&g));
            if self.tt.stage_device[a.stage as usize - 1] == self.here {
                st.bwd_in.insert((a.stage - 1, a.microbatch), g);
            } else {
                st.outbox.insert((a.stage, a.microbatch, false), g);
            }
        }
        Ok(())
    }

    /// R: rebuild the stash now, so the backward finds it whole.
    fn recompute_stash(&mut self, st: &mut StateOf<M>) -> Result<(), ModuleError> {
        let stash = take(&mut st.stash, self.key, "stash (its forward)")?;
        let full = rebuild(self.module, &self.data, stash, &mut self.tp, st)?;
        st.stash.insert(self.key, full);
        st.rebuilt.insert(self.key);
        Ok(())
    }

    /// W: the weight backward from what the I kept.
    fn weight(&mut self, st: &mut StateOf<M>) -> Result<(), ModuleError> {
        let ws = take(&mut st.wstash, self.key, "weight stash (its I)")?;
        st.free_bytes(ws.bytes());
        self.module.backward_weight(ws)?;
        st.live -= 1;
        Ok(())
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
