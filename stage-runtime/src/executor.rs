//! The per-device executor: runs one device's row of a lowered timetable, in order.
//!
//! Receives are posted at the start of the step (spawned as local tasks) and awaited only
//! where the row needs them; sends return at once. Activations are stashed per (stage,
//! microbatch) from F to the backward; hand-offs between two stages of one device stay in
//! memory. A stage's gradients start their data-parallel all-reduce right after its last
//! backward of the step and are waited on only at the end, before the optimizer step. Under
//! ZeRO-1 ([`crate::zero`]) that reduction is a reduce-scatter, the optimizer steps the
//! rank's shard, and the updated shards are all-gathered.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{Footprint, KernelError};
use pipewright_schedule::{Action, ActionKind, Event, Recompute, Timetable};
use tokio::task::JoinHandle;

use crate::batch::StepBatch;
use crate::comm::{shard_range, CommError, Communicator, Direction, ReduceOp, Tag};
use crate::error::RuntimeError;
use crate::memory::{Category, DeviceMemory, Meter, RankMemory};
use crate::mesh::{Coord, Group, GroupKind, Mesh};
use crate::module::unimplemented_method;
use crate::module::{guard, MicrobatchData, ModuleError, Output, StageModule};
use crate::options::RunOptions;
use crate::setup::{
    check_backward_split, check_methods, check_tp, kept_whole, needed_for, set_recompute, Sizes,
};
use crate::zero::Zero;

mod boundary;
mod compute;
mod ep;
mod first_step;
mod grads;

use ep::moves_host;
pub(crate) use ep::{merge_experts, to_comm, to_host};

use boundary::{boundary_error, Handoffs};

/// What one device did in one step.
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    /// Sum of the scaled losses this rank computed (last stage only).
    pub loss: Option<f32>,
    /// Events, in milliseconds since the run's epoch.
    pub events: Vec<Event>,
    /// Most stage-microbatches stashed at once.
    pub peak_stash: u32,
    /// Most bytes kept in stashes at once (forward stashes, a recomputed one included, and
    /// weight stashes), as the modules count them.
    pub peak_stash_bytes: u64,
    /// The most bytes one forward's stash kept (after its recompute policy).
    pub kept_per_microbatch: u64,
    /// Bytes of optimizer state this rank's modules hold after the step.
    pub optimizer_state_bytes: u64,
    /// This rank's measured memory by category ([`crate::memory`]).
    pub memory: RankMemory,
}

/// Executes one device's row for every step of a run. The communicator and the stage
/// modules carry the same tensor type (host or device).
pub struct Executor<C: Communicator, M: StageModule<Tensor = C::Tensor>> {
    comm: Rc<C>,
    mesh: Mesh,
    coord: Coord,
    tt: Rc<Timetable>,
    modules: HashMap<u32, M>,
    adamw: AdamWConfig,
    tp_group: Group,
    dp_group: Group,
    /// Under expert parallelism (`mesh.ep > 1`): the EP group, whose all-to-all the mixtures
    /// call, and the expert-DP group, which sums the gradients of this rank's experts.
    ep_groups: Option<(Group, Group)>,
    /// Whether gradients are reduce-scattered and the optimizer sharded (ZeRO-1 over
    /// several replicas).
    sharded: bool,
    timeout: Duration,
    epoch: Instant,
    /// Stages that recompute, and how.
    recompute: HashMap<u32, Recompute>,
    /// Microbatches of recomputing stages that keep their whole stash: where the timetable
    /// recomputes only some microbatches of a stage (with `R`s, as the search does under a
    /// cap), those without an `R`.
    whole: HashSet<(u32, u32)>,
    check_finite: bool,
    /// Parameter and gradient bytes of modules that do not report them.
    sizes: Sizes,
    /// Each stage's hand-off shapes, fixed by its first forward (by stage).
    handoffs: Vec<Handoffs>,
    /// Stages that received a non-zero output gradient or computed a non-zero loss in
    /// step 0: every parameter of theirs should then have a gradient.
    reached: HashSet<u32>,
    /// [`RunOptions::allow_unused`].
    allow_unused: Vec<String>,
}

/// A stage's gradient reduction in flight: a DP all-reduce, or under ZeRO-1 a
/// reduce-scatter of `numel` flat values.
struct Reduction<P> {
    stage: u32,
    numel: usize,
    pending: P,
    /// Under expert parallelism: the experts' part, summed over the expert-DP group, and
    /// where its runs lie in the stage's flat gradients (`pending` then holds the rest).
    experts: Option<(P, Vec<std::ops::Range<usize>>)>,
}

/// The TP all-reduce the kernels call in the middle of a layer.
struct TpReducer<'a, C: Communicator> {
    comm: &'a C,
    group: &'a Group,
    /// The EP group's all-to-all, under expert parallelism.
    ep: Option<ep::EpExchange<'a, C>>,
}

impl<'a, C: Communicator> TpReducer<'a, C> {
    fn new(comm: &'a C, group: &'a Group, ep_groups: Option<&'a (Group, Group)>) -> Self {
        let ep = ep_groups.map(|(group, _)| ep::EpExchange { comm, group });
        TpReducer { comm, group, ep }
    }
}

impl<C: Communicator> TpReduce<C::Tensor> for TpReducer<'_, C>
where
    C::Tensor: 'static,
{
    fn expert_exchange(
        &mut self,
    ) -> Option<&mut dyn pipewright_kernels::layers::moe::ep::ExpertExchange> {
        self.ep
            .as_mut()
            .map(|e| e as &mut dyn pipewright_kernels::layers::moe::ep::ExpertExchange)
    }

    fn all_reduce_sum(&mut self, t: &mut C::Tensor) -> Result<(), KernelError> {
        if self.group.size() == 1 {
            return Ok(());
        }
        self.comm
            .all_reduce(self.group, t, ReduceOp::Sum)
            .map_err(|e| KernelError::Reduce(Box::new(e)))
    }

    fn all_gather(&mut self, t: &C::Tensor) -> Result<Vec<C::Tensor>, KernelError> {
        self.comm
            .all_gather(self.group, t)
            .map_err(|e| KernelError::Reduce(Box::new(e)))
    }

    fn reduce_scatter_sum(&mut self, t: &C::Tensor) -> Result<C::Tensor, KernelError> {
        // Equal blocks: the kernels hand over `t * block` values, and `shard_range` then cuts
        // exactly the blocks the kernels expect.
        self.comm
            .reduce_scatter(self.group, t, ReduceOp::Sum)
            .map_err(|e| KernelError::Reduce(Box::new(e)))
    }
}

/// Per-step state: tensors (`T`) in flight between actions of this device.
struct StepState<T, S, W> {
    /// Inputs of F (received or handed off), by (stage, microbatch).
    fwd_in: HashMap<(u32, u32), T>,
    /// Output gradients of B/I, by (stage, microbatch).
    bwd_in: HashMap<(u32, u32), T>,
    /// Tensors waiting for their SEND, by (stage, microbatch, direction).
    outbox: HashMap<(u32, u32, bool), T>,
    stash: HashMap<(u32, u32), S>,
    wstash: HashMap<(u32, u32), W>,
    live: u32,
    peak: u32,
    /// Bytes held by category (stashes are its activations); the largest one forward's stash.
    mem: Meter,
    kept: u64,
    /// Microbatches whose stash an `R` action already rebuilt.
    rebuilt: HashSet<(u32, u32)>,
    loss: Option<f32>,
}

impl<T, S, W> StepState<T, S, W> {
    fn new() -> Self {
        StepState {
            fwd_in: HashMap::new(),
            bwd_in: HashMap::new(),
            outbox: HashMap::new(),
            stash: HashMap::new(),
            wstash: HashMap::new(),
            live: 0,
            peak: 0,
            mem: Meter::default(),
            kept: 0,
            rebuilt: HashSet::new(),
            loss: None,
        }
    }

    /// Count `n` more bytes kept in stashes.
    fn keep_bytes(&mut self, n: usize) {
        self.mem.add(Category::Activations, n as u64);
    }

    /// Count `n` stashed bytes released.
    fn free_bytes(&mut self, n: usize) {
        self.mem.sub(Category::Activations, n as u64);
    }
}

/// A stage's tensors of one step, as the executor keeps them.
type StateOf<M> = StepState<
    <M as StageModule>::Tensor,
    <M as StageModule>::Stash,
    <M as StageModule>::WeightStash,
>;

/// A posted receive.
type Posted<T> = JoinHandle<Result<T, CommError>>;

impl<C, M> Executor<C, M>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    /// An executor for the rank at `coord`, holding `modules` (its stages of the lowered
    /// timetable `tt`), with the AdamW settings and the timeout of `opts`.
    pub fn new(
        comm: Rc<C>,
        mesh: Mesh,
        coord: Coord,
        tt: Rc<Timetable>,
        mut modules: HashMap<u32, M>,
        opts: &RunOptions,
        epoch: Instant,
    ) -> Result<Self, RuntimeError> {
        let (adamw, timeout) = (opts.adamw, opts.timeout);
        let rank = mesh.rank(coord);
        check_backward_split(&tt, coord.pp, &modules)?;
        let recompute = set_recompute(&tt, &opts.recompute, &mut modules)?;
        let whole = kept_whole(&tt.devices[coord.pp], &recompute);
        let sharded = opts.zero == Zero::One && mesh.dp > 1;
        if let Some((&stage, _)) = modules
            .iter()
            .find(|(_, m)| sharded && !m.shards_optimizer())
        {
            return Err(RuntimeError::NoShardedOptimizer { stage, dp: mesh.dp });
        }
        check_tp(&modules, mesh.tp)?;
        let ep_groups = check_ep::<C, M>(mesh, rank, &modules, sharded)?;
        let sizes = check_methods(&mut modules, mesh.dp, sharded, opts.check_finite)?;
        let handoffs = (0..tt.num_stages()).map(|_| Handoffs::default()).collect();
        Ok(Executor {
            comm,
            mesh,
            coord,
            tp_group: mesh.group(GroupKind::Tp, rank)?,
            dp_group: mesh.group(GroupKind::Dp, rank)?,
            ep_groups,
            sharded,
            tt,
            modules,
            adamw,
            timeout,
            epoch,
            recompute,
            whole,
            check_finite: opts.check_finite,
            sizes,
            handoffs,
            reached: HashSet::new(),
            allow_unused: opts.allow_unused.clone(),
        })
    }

    /// The EP group, under expert parallelism.
    pub(crate) fn ep_group(&self) -> Option<&Group> {
        self.ep_groups.as_ref().map(|(g, _)| g)
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &C {
        &self.comm
    }

    /// This rank's stage modules.
    pub fn modules(&self) -> &HashMap<u32, M> {
        &self.modules
    }

    /// Mutable access to the stage modules (to read parameters after a run).
    pub fn modules_mut(&mut self) -> &mut HashMap<u32, M> {
        &mut self.modules
    }

    fn rank_of_device(&self, device: u32) -> usize {
        self.mesh.rank(Coord {
            pp: device as usize,
            ..self.coord
        })
    }

    /// A module's error in `action` (or between actions, at `stage`); a method the module
    /// does not implement is named with what needed it.
    fn module_fail(
        &self,
        step: u64,
        action: Option<Action>,
        stage: u32,
        e: ModuleError,
    ) -> RuntimeError {
        match unimplemented_method(&e) {
            Some(method) => {
                let why = needed_for(method, self.mesh.dp);
                self.fail(step, action, format!("stage {stage}: {why}"))
            }
            None => self.fail(step, action, e),
        }
    }

    fn fail(&self, step: u64, action: Option<Action>, message: impl ToString) -> RuntimeError {
        RuntimeError::device(
            self.mesh.rank(self.coord),
            self.coord,
            step,
            action,
            message.to_string(),
        )
    }

    /// Run one step: the row, then gradient reduction and the optimizer.
    pub async fn run_step(
        &mut self,
        step: u64,
        batch: &StepBatch<M::Data>,
    ) -> Result<StepOutcome, RuntimeError> {
        let row: Vec<Action> = self.tt.devices[self.coord.pp].clone();
        let last_backward = last_backward_per_stage(&row);
        let mut posted = self.post_receives(step, &row);
        self.check_data(step, batch)?;
        let mut st: StateOf<M> = StepState::new();
        self.count_module_state(&mut st.mem);
        let mut pending = Vec::new();
        let mut events = Vec::with_capacity(row.len());
        for (i, &a) in row.iter().enumerate() {
            let start = self.now();
            match a.kind {
                ActionKind::RecvF | ActionKind::RecvB => {
                    self.await_recv(step, a, &mut posted, &mut st).await?
                }
                ActionKind::SendF | ActionKind::SendB => self.send(step, a, &mut st)?,
                // An F&B overlap runs as its F, then its B: correct on any device, and what a
                // CPU can do; a GPU transport may run the two on separate streams.
                _ => a
                    .parts()
                    .try_for_each(|part| self.compute(step, part, batch, &mut st))?,
            }
            for part in a.parts() {
                if last_backward.get(&part.stage) != Some(&i) {
                    continue;
                }
                self.reduce_tp_grads(step, part)?;
                if self.dp_group.size() > 1 {
                    if let Some(r) = self.start_grad_reduce(step, part)? {
                        st.mem.add(Category::Buffers, F32 * r.numel as u64);
                        pending.push(r);
                    }
                }
            }
            events.push(Event {
                device: self.coord.pp as u32,
                action: a,
                start,
                end: self.now(),
            });
        }
        self.finish_step(step, pending, &mut st.mem)?;
        self.check_targets(step, batch)?;
        self.count_module_state(&mut st.mem);
        let optimizer_state_bytes = st.mem.now(Category::OptimizerState);
        let device = self.device_memory(step)?;
        Ok(StepOutcome {
            loss: st.loss,
            events,
            peak_stash: st.peak,
            peak_stash_bytes: st.mem.max().activations,
            kept_per_microbatch: st.kept,
            optimizer_state_bytes,
            memory: st.mem.finish(device),
        })
    }

    /// Set the meter's parameters, gradients and optimizer state to what the modules hold.
    fn count_module_state(&self, mem: &mut Meter) {
        let sum = |f: fn(&M) -> usize| self.modules.values().map(|m| f(m) as u64).sum();
        // Modules that do not report their sizes are counted from their flat views.
        let (params, grads) = self
            .sizes
            .values()
            .fold((0, 0), |(p, g), (dp, dg)| (p + dp, g + dg));
        mem.set(Category::Parameters, sum(M::parameter_bytes) + params);
        mem.set(Category::Gradients, sum(M::gradient_bytes) + grads);
        mem.set(Category::OptimizerState, sum(M::optimizer_state_bytes));
    }

    /// The driver's figures of this rank's GPU (one module asked: they share the device).
    fn device_memory(&self, step: u64) -> Result<Option<DeviceMemory>, RuntimeError> {
        let Some(module) = self.modules.values().next() else {
            return Ok(None);
        };
        let info = guard(|| module.device_memory())
            .map_err(|e| self.fail(step, None, format!("reading the GPU's memory figures: {e}")))?;
        Ok(info.map(|(free, total)| DeviceMemory {
            free: free as u64,
            total: total as u64,
        }))
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e3
    }

    /// The rank holding the stage that `a` (a send or receive) pairs with, and the message's
    /// tag, which names the sending stage.
    fn peer(&self, step: u64, a: Action) -> (usize, Tag) {
        // Lowered, validated timetables give every comm action a counterpart.
        let other = a.counterpart().unwrap_or(a);
        let rank = self.rank_of_device(self.tt.stage_device[other.stage as usize]);
        let (sender, dir) = match a.kind {
            ActionKind::SendF => (a.stage, Direction::Forward),
            ActionKind::SendB => (a.stage, Direction::Backward),
            ActionKind::RecvF => (other.stage, Direction::Forward),
            _ => (other.stage, Direction::Backward),
        };
        let tag = Tag {
            step,
            dir,
            stage: sender,
            microbatch: a.microbatch,
        };
        (rank, tag)
    }

    fn post_receives(&self, step: u64, row: &[Action]) -> HashMap<Action, Posted<C::Tensor>> {
        row.iter()
            .filter(|a| matches!(a.kind, ActionKind::RecvF | ActionKind::RecvB))
            .map(|&a| {
                let (src, tag) = self.peer(step, a);
                let comm = Rc::clone(&self.comm);
                (
                    a,
                    tokio::task::spawn_local(async move { comm.recv(src, tag).await }),
                )
            })
            .collect()
    }

    async fn await_recv(
        &self,
        step: u64,
        a: Action,
        posted: &mut HashMap<Action, Posted<C::Tensor>>,
        st: &mut StateOf<M>,
    ) -> Result<(), RuntimeError> {
        let (src, tag) = self.peer(step, a);
        let handle = posted
            .remove(&a)
            .ok_or_else(|| self.fail(step, Some(a), "receive was not posted"))?;
        let t = match tokio::time::timeout(self.timeout, handle).await {
            Err(_) => {
                let what = format!("{tag} from rank {src}");
                return Err(self.fail(
                    step,
                    Some(a),
                    CommError::Timeout {
                        what,
                        secs: self.timeout.as_secs_f64(),
                    },
                ));
            }
            Ok(Err(join)) => {
                return Err(self.fail(step, Some(a), format!("receive task failed: {join}")))
            }
            Ok(Ok(r)) => r.map_err(|e| self.fail(step, Some(a), e))?,
        };
        let key = (a.stage, a.microbatch);
        st.mem
            .add(Category::Buffers, F32 * self.comm.numel(&t) as u64);
        if a.kind == ActionKind::RecvF {
            st.fwd_in.insert(key, t);
        } else {
            st.bwd_in.insert(key, t);
        }
        Ok(())
    }

    fn send(&self, step: u64, a: Action, st: &mut StateOf<M>) -> Result<(), RuntimeError> {
        let forward = a.kind == ActionKind::SendF;
        let t = st
            .outbox
            .remove(&(a.stage, a.microbatch, forward))
            .ok_or_else(|| {
                self.fail(
                    step,
                    Some(a),
                    "nothing to send: the producing compute did not run",
                )
            })?;
        let (dst, tag) = self.peer(step, a);
        // Handed to the transport: no longer this executor's to count.
        st.mem
            .sub(Category::Buffers, F32 * self.comm.numel(&t) as u64);
        self.comm
            .send(dst, tag, t)
            .map_err(|e| self.fail(step, Some(a), e))
    }
}

/// Bytes per element of the tensors the runtime moves (f32 storage on every backend).
const F32: u64 = 4;

/// Index in `row` of each stage's last backward (B or W): where its gradients are final.
fn last_backward_per_stage(row: &[Action]) -> HashMap<u32, usize> {
    row.iter()
        .enumerate()
        .flat_map(|(i, a)| a.parts().map(move |p| (i, p)))
        .filter(|(_, p)| matches!(p.kind, ActionKind::B | ActionKind::W))
        .map(|(i, p)| (p.stage, i))
        .collect()
}

/// Under `ep > 1`, the EP and expert-DP groups of `rank`, after refusing, in one line naming
/// `ep`, what expert parallelism does not run with: ZeRO-1, device tensors, and a stage whose
/// module does not say where its experts are.
fn check_ep<C, M>(
    mesh: Mesh,
    rank: usize,
    modules: &HashMap<u32, M>,
    sharded: bool,
) -> Result<Option<(Group, Group)>, RuntimeError>
where
    C: Communicator,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    if mesh.ep < 2 {
        return Ok(None);
    }
    let ep = mesh.ep;
    if sharded {
        return Err(RuntimeError::Model(format!(
            "ep = {ep} does not run with ZeRO-1 yet: the optimizer shards would cut across \
             experts that each replica does not hold"
        )));
    }
    if !moves_host::<C::Tensor>() {
        return Err(RuntimeError::Model(format!(
            "ep = {ep} runs on the in-process and MPI transports, which move host tensors; \
             this one moves device tensors"
        )));
    }
    let mut stages: Vec<&u32> = modules.keys().collect();
    stages.sort_unstable();
    for &stage in stages {
        if modules[&stage].expert_ranges().is_none() {
            return Err(RuntimeError::Module {
                stage,
                method: "expert_ranges",
                message: format!(
                    "ep = {ep} needs its module to say which of its parameters are its \
                     experts (expert_ranges)"
                ),
            });
        }
    }
    Ok(Some((
        mesh.group(GroupKind::Ep, rank)?,
        mesh.group(GroupKind::ExpertDp, rank)?,
    )))
}
