//! Run a timetable on in-process devices: one OS thread per rank, each with a current-thread
//! tokio runtime, all joined by a [`LocalWorld`]. What one rank does (`run_rank`) works over
//! any communicator; `run_mpi` (feature `mpi`) runs it once per process.

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use pipewright_kernels::Tensor;
use pipewright_model::memory::MemoryBreakdown;
use pipewright_schedule::{Checked, Timeline, TimelineMeta, TimelineSource, Timetable};

use crate::batch::{MicrobatchId, StepBatch};
use crate::comm::local::{HostOps, LocalOps, LocalWorld};
use crate::comm::Communicator;
use crate::erase::{erase, erase_data, AnyData, ErasedModule};
use crate::error::RuntimeError;
use crate::executor::{merge_experts, to_comm, to_host, Executor, StepOutcome};
use crate::memory::RankMemory;
use crate::mesh::{Coord, Mesh};
use crate::module::{first_non_finite, ModuleError, StageModule};
pub use crate::options::RunOptions;
use crate::setup::check_replicas_agree;

/// One step, as measured.
#[derive(Clone, Debug)]
pub struct StepRecord {
    /// Step index.
    pub step: u64,
    /// Global loss (sum of every data-parallel replica's scaled losses), if the model has one.
    pub loss: Option<f32>,
    /// Wall time of the step in seconds (first action start to last action end).
    pub seconds: f64,
    /// What each pipeline device did (from its TP 0, DP 0 rank), in milliseconds.
    pub timeline: Timeline,
    /// Most stage-microbatches each pipeline device stashed at once.
    pub peak_stash: Vec<u32>,
    /// Most bytes each pipeline device kept in stashes at once (forward stashes, including
    /// one rebuilt by recomputation, and weight stashes between I and W), as its modules
    /// count them (the [`Footprint`](pipewright_kernels::Footprint) of their stashes).
    pub peak_stash_bytes: Vec<u64>,
    /// The most bytes one forward's stash kept on each pipeline device (per microbatch, after
    /// the recompute policy dropped what it drops).
    pub kept_per_microbatch: Vec<u64>,
    /// Bytes of optimizer state each rank held after the step, by global rank (a ZeRO-1
    /// replica holds about `1 / dp` of its stage's).
    pub optimizer_state_bytes: Vec<u64>,
    /// Each rank's measured memory by category, by global rank ([`crate::memory`]).
    pub memory: Vec<RankMemory>,
    /// Where the step's time zero (its first compute) lies on the run's clock, in ms since
    /// the run began: steps overlap, so their timelines line up only with this added.
    pub origin_ms: f64,
}

impl StepRecord {
    /// Measured bubble fraction: `1 - busiest device's compute / step time`.
    pub fn bubble_fraction(&self) -> f64 {
        self.timeline.bubble_fraction()
    }

    /// Each pipeline device's measured peak: the [`RankMemory::peak`] with the highest total
    /// among the device's ranks (its TP and DP ranks; ZeRO-1 shards and TP splits differ).
    pub fn device_peaks(&self, mesh: &Mesh) -> Vec<MemoryBreakdown> {
        let mut out = vec![MemoryBreakdown::default(); mesh.pp];
        for (rank, m) in self.memory.iter().enumerate() {
            if let Ok(c) = mesh.coord(rank) {
                if m.peak.total() > out[c.pp].total() {
                    out[c.pp] = m.peak;
                }
            }
        }
        out
    }
}

/// Parameters after the run, from each stage's DP 0 replicas: `(stage, tp rank) -> flat values`.
pub type FinalParams = BTreeMap<(u32, usize), Vec<f32>>;

/// The lowered timetable a mesh runs (validated by the caller: a [`Checked`]).
pub fn prepare(tt: &Checked, mesh: &Mesh) -> Result<Checked, RuntimeError> {
    if tt.num_devices() as usize != mesh.pp {
        return Err(RuntimeError::Timetable(format!(
            "it has {} devices, but the mesh has pp = {}",
            tt.num_devices(),
            mesh.pp
        )));
    }
    let low = tt
        .lowered()
        .map_err(|e| RuntimeError::Timetable(e.to_string()))?;
    Ok(low.into_owned())
}

/// Run `opts.steps` steps of `tt` over `mesh`. `make(coord, stage)` builds a rank's module
/// for a stage; `data(id)` builds one microbatch of the user's data on every rank that needs
/// it (see [`MicrobatchId`]; the runtime adds the loss scale). `on_step` sees
/// each step as soon as every rank has finished it. On any failure every rank stops and the
/// error of the rank that failed first is returned. Under `dp > 1`, `make` must build every
/// replica of a stage with the same parameters: each replica's module is built once more
/// before the run and compared with replica 0's, and replicas that differ are refused.
///
/// The module, its data and its stashes own what they hold (`'static`): the run carries them
/// as `dyn Any`, so that its executor is compiled once for every module type.
pub fn run<M, MF, DF, CB>(
    mesh: Mesh,
    tt: &Checked,
    make: MF,
    data: DF,
    opts: &RunOptions,
    mut on_step: CB,
) -> Result<FinalParams, RuntimeError>
where
    M: StageModule<Tensor = Tensor> + 'static,
    M::Data: 'static,
    M::Stash: 'static,
    M::WeightStash: 'static,
    MF: Fn(Coord, u32) -> Result<M, ModuleError> + Sync,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError> + Sync,
    CB: FnMut(&StepRecord),
{
    // The module's type stops here: what follows is compiled once, in this crate.
    let make = |c: Coord, s: u32| make(c, s).map(erase);
    let data = |id: MicrobatchId| data(id).map(erase_data);
    run_host(mesh, tt, &make, &data, opts, &mut on_step)
}

/// [`run`] of any module, on host tensors.
fn run_host(
    mesh: Mesh,
    tt: &Checked,
    make: &(dyn Fn(Coord, u32) -> Result<ErasedModule<Tensor>, ModuleError> + Sync),
    data: &(dyn Fn(MicrobatchId) -> Result<AnyData, ModuleError> + Sync),
    opts: &RunOptions,
    on_step: &mut dyn FnMut(&StepRecord),
) -> Result<FinalParams, RuntimeError> {
    check_replicas_agree(mesh, tt, &make)?;
    let make = |c: Coord, s: u32, _: &HostOps| make(c, s);
    run_local(mesh, tt, |_| Ok(HostOps), make, data, opts, on_step)
}

/// [`run`] over any in-process data plane: `ops(rank)` builds a rank's [`LocalOps`] on that
/// rank's thread (a GPU stream, say) and `make(coord, stage, ops)` its modules, which may
/// share it. The CUDA-local transport runs through here.
pub fn run_local<K, M, OF, MF, DF, CB>(
    mesh: Mesh,
    tt: &Checked,
    ops: OF,
    make: MF,
    data: DF,
    opts: &RunOptions,
    mut on_step: CB,
) -> Result<FinalParams, RuntimeError>
where
    K: LocalOps + 'static,
    K::Tensor: 'static,
    M: StageModule<Tensor = K::Tensor>,
    OF: Fn(usize) -> Result<K, ModuleError> + Sync,
    MF: Fn(Coord, u32, &K) -> Result<M, ModuleError> + Sync,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError> + Sync,
    CB: FnMut(&StepRecord),
{
    let tt = prepare(tt, &mesh)?;
    let world = LocalWorld::<K::Message>::with_payload(mesh.world_size(), opts.timeout);
    let epoch = Instant::now();
    let (tx, rx) = mpsc::channel::<(Coord, u64, StepOutcome)>();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..mesh.world_size())
            .map(|rank| {
                let (tx, world, tt) = (tx.clone(), &world, &tt);
                let (ops, make, data) = (&ops, &make, &data);
                scope.spawn(move || {
                    let threads = Threads {
                        world,
                        ops,
                        make,
                        data,
                        tx: &tx,
                    };
                    rank_thread(&threads, rank, mesh, tt, opts, epoch)
                })
            })
            .collect();
        drop(tx);
        let mut assembler = Assembler::new(&tt, mesh);
        for (coord, step, outcome) in rx {
            if let Some(record) = assembler.add(coord, step, outcome) {
                on_step(&record);
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(RuntimeError::Model("rank thread lost".into())))
            })
            .collect::<Vec<_>>()
    });
    combine(results, world.abort_reason())
}

/// The run's answer from its ranks' results: their final parameters, or the error that
/// stopped the run (the one whose text is the world's abort reason `root`, else the first).
fn combine(
    results: Vec<Result<FinalParams, RuntimeError>>,
    root: Option<String>,
) -> Result<FinalParams, RuntimeError> {
    let mut params = FinalParams::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(p) => params.extend(p),
            Err(e) => errors.push(e),
        }
    }
    match errors.iter().position(|e| Some(e.to_string()) == root) {
        Some(i) => Err(errors.swap_remove(i)),
        None => errors.into_iter().next().map_or(Ok(params), Err),
    }
}

/// What every rank thread of an in-process run shares.
struct Threads<'a, K: LocalOps, OF, MF, DF> {
    world: &'a Arc<LocalWorld<K::Message>>,
    ops: &'a OF,
    make: &'a MF,
    data: &'a DF,
    tx: &'a mpsc::Sender<(Coord, u64, StepOutcome)>,
}

/// One rank thread of an in-process run: its part of the run, with a panic made an error
/// naming the rank, and any error stopping every other rank.
fn rank_thread<K, M, OF, MF, DF>(
    th: &Threads<'_, K, OF, MF, DF>,
    rank: usize,
    mesh: Mesh,
    tt: &Timetable,
    opts: &RunOptions,
    epoch: Instant,
) -> Result<FinalParams, RuntimeError>
where
    K: LocalOps + 'static,
    K::Tensor: 'static,
    M: StageModule<Tensor = K::Tensor>,
    OF: Fn(usize) -> Result<K, ModuleError>,
    MF: Fn(Coord, u32, &K) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
{
    let coord = mesh.coord(rank)?;
    let body = || rank_main(th, mesh, coord, tt, opts, epoch);
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        Err(RuntimeError::device(
            rank,
            coord,
            0,
            None,
            "rank thread panicked".into(),
        ))
    });
    if let Err(e) = &r {
        th.world.abort(&e.to_string());
    }
    r
}

fn rank_main<K, M, OF, MF, DF>(
    th: &Threads<'_, K, OF, MF, DF>,
    mesh: Mesh,
    coord: Coord,
    tt: &Timetable,
    opts: &RunOptions,
    epoch: Instant,
) -> Result<FinalParams, RuntimeError>
where
    K: LocalOps + 'static,
    K::Tensor: 'static,
    M: StageModule<Tensor = K::Tensor>,
    OF: Fn(usize) -> Result<K, ModuleError>,
    MF: Fn(Coord, u32, &K) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
{
    let rank = mesh.rank(coord);
    let ops = (th.ops)(rank).map_err(|e| {
        RuntimeError::device(rank, coord, 0, None, format!("starting the transport: {e}"))
    })?;
    let comm = Rc::new(th.world.comm_with(rank, ops));
    let make = |c: Coord, s: u32| (th.make)(c, s, comm.ops());
    let ctx = RankContext {
        mesh,
        coord,
        tt,
        opts,
        epoch,
    };
    // The driver may have stopped listening after an error elsewhere; that is fine.
    run_rank(Rc::clone(&comm), &ctx, &make, th.data, |step, outcome| {
        let _ = th.tx.send((coord, step, outcome));
        Ok(())
    })
}

/// What one rank needs to know to run its part, whatever the transport.
pub(crate) struct RankContext<'a> {
    pub(crate) mesh: Mesh,
    pub(crate) coord: Coord,
    /// Lowered and validated ([`prepare`]).
    pub(crate) tt: &'a Timetable,
    pub(crate) opts: &'a RunOptions,
    /// Time zero of every rank's events.
    pub(crate) epoch: Instant,
}

/// One rank's whole run over any [`Communicator`]: build its stages, run every step on a
/// current-thread tokio runtime (receives are local tasks), hand each step's outcome to
/// `on_outcome`, and return its final parameters (DP 0 ranks only; others return none).
pub(crate) fn run_rank<C, M, MF, DF, OF>(
    comm: Rc<C>,
    ctx: &RankContext<'_>,
    make: &MF,
    data: &DF,
    mut on_outcome: OF,
) -> Result<FinalParams, RuntimeError>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
    MF: Fn(Coord, u32) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
    OF: FnMut(u64, StepOutcome) -> Result<(), RuntimeError>,
{
    let (mesh, coord, tt) = (ctx.mesh, ctx.coord, ctx.tt);
    let rank = mesh.rank(coord);
    let fail = |m: String| RuntimeError::device(rank, coord, 0, None, m);
    let mut modules = HashMap::new();
    for stage in (0..tt.num_stages()).filter(|&s| tt.stage_device[s as usize] as usize == coord.pp)
    {
        modules.insert(
            stage,
            make(coord, stage).map_err(|e| fail(format!("building stage {stage}: {e}")))?,
        );
    }
    let m = tt.microbatches;
    let tt = Rc::new(tt.clone());
    let mut exec = Executor::new(comm, mesh, coord, tt, modules, ctx.opts, ctx.epoch)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        for step in 0..ctx.opts.steps {
            let b = StepBatch::build(step, (coord.dp, mesh.dp), m, data)
                .map_err(|e| RuntimeError::device(rank, coord, step, None, format!("data: {e}")))?;
            let outcome = exec.run_step(step, &b).await?;
            on_outcome(step, outcome)?;
        }
        Ok::<(), RuntimeError>(())
    })?;
    let mut params = FinalParams::new();
    // Under expert parallelism the first `ep` replicas hold a stage's experts between them.
    if coord.dp < mesh.ep.max(1) {
        let mut stages: Vec<u32> = exec.modules().keys().copied().collect();
        stages.sort_unstable();
        for stage in stages {
            let Some(p) = final_params(&mut exec, stage)
                .map_err(|e| fail(format!("reading the parameters of stage {stage}: {e}")))?
            else {
                continue;
            };
            // The last step's update, which no later loss will see (and the only check of a
            // module whose gradients the per-step check cannot read).
            if let Some(value) = first_non_finite(&p).filter(|_| ctx.opts.check_finite) {
                return Err(RuntimeError::NonFinite {
                    rank,
                    coord,
                    step: ctx.opts.steps.saturating_sub(1),
                    stage,
                    microbatch: None,
                    what: "parameter",
                    value,
                });
            }
            if coord.dp == 0 {
                params.insert((stage, coord.tp), p);
            }
        }
    }
    Ok(params)
}

/// A stage's final flat parameters; under expert parallelism every EP rank's experts,
/// gathered over the EP group (every member calls this, stage by stage) and spliced in.
fn final_params<C, M>(
    exec: &mut Executor<C, M>,
    stage: u32,
) -> Result<Option<Vec<f32>>, ModuleError>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    let module = exec
        .modules_mut()
        .get_mut(&stage)
        .ok_or_else(|| RuntimeError::missing_stage(stage))?;
    let runs = module.expert_ranges().unwrap_or_default();
    let Some(p) = module.flat_params()? else {
        return Ok(None);
    };
    let Some(group) = exec.ep_group().cloned() else {
        return Ok(Some(p));
    };
    let flat = Tensor::new(&[p.len()], p)?;
    let parts = exec.comm().all_gather(&group, &to_comm(flat)?)?;
    let parts = parts
        .into_iter()
        .map(to_host)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(merge_experts(&parts, &runs)?))
}

/// Gathers each step's outcomes from every rank into a [`StepRecord`].
pub(crate) struct Assembler {
    mesh: Mesh,
    /// Pipeline device holding the last stage (device 0 under placement "v").
    loss_device: usize,
    meta: TimelineMeta,
    pending: HashMap<u64, Vec<(Coord, StepOutcome)>>,
}

impl Assembler {
    pub(crate) fn new(tt: &Timetable, mesh: Mesh) -> Self {
        let meta = TimelineMeta {
            schedule: tt.name.clone(),
            devices: tt.num_devices(),
            stages: tt.num_stages(),
            microbatches: tt.microbatches,
            source: TimelineSource::Measured,
            time_unit: "ms".into(),
        };
        // Under placement "v" the last stage, and so the loss, is on device 0.
        let loss_device = tt.stage_device.last().map_or(0, |&d| d as usize);
        Assembler {
            mesh,
            loss_device,
            meta,
            pending: HashMap::new(),
        }
    }

    pub(crate) fn add(
        &mut self,
        coord: Coord,
        step: u64,
        outcome: StepOutcome,
    ) -> Option<StepRecord> {
        let list = self.pending.entry(step).or_default();
        list.push((coord, outcome));
        if list.len() < self.mesh.world_size() {
            return None;
        }
        let list = self.pending.remove(&step)?;
        let loss = list
            .iter()
            .filter(|(c, _)| c.pp == self.loss_device && c.tp == 0)
            .filter_map(|(_, o)| o.loss)
            .reduce(|a, b| a + b);
        let lead: Vec<&(Coord, StepOutcome)> = list
            .iter()
            .filter(|(c, _)| c.tp == 0 && c.dp == 0)
            .collect();
        let mut events: Vec<_> = lead
            .iter()
            .flat_map(|(_, o)| o.events.iter().copied())
            .collect();
        // Steps are not fenced: a device whose previous step ended early posts its first
        // receive while others are still finishing. The step starts with its first compute;
        // waits begun before that belong to the gap between steps and are clipped.
        let first_compute = events
            .iter()
            .filter(|e| e.action.kind.is_compute())
            .map(|e| e.start)
            .reduce(f64::min);
        let t0 = first_compute
            .or_else(|| events.iter().map(|e| e.start).reduce(f64::min))
            .unwrap_or(0.0);
        for e in &mut events {
            e.start = (e.start - t0).max(0.0);
            e.end = (e.end - t0).max(e.start);
        }
        let mut optimizer_state_bytes = vec![0; self.mesh.world_size()];
        let mut memory = vec![RankMemory::default(); self.mesh.world_size()];
        for (c, o) in &list {
            optimizer_state_bytes[self.mesh.rank(*c)] = o.optimizer_state_bytes;
            memory[self.mesh.rank(*c)] = o.memory;
        }
        let mut peak_stash = vec![0; self.mesh.pp];
        let mut peak_stash_bytes = vec![0; self.mesh.pp];
        let mut kept_per_microbatch = vec![0; self.mesh.pp];
        for (c, o) in &lead {
            peak_stash[c.pp] = o.peak_stash;
            peak_stash_bytes[c.pp] = o.peak_stash_bytes;
            kept_per_microbatch[c.pp] = o.kept_per_microbatch;
        }
        let timeline = Timeline {
            meta: self.meta.clone(),
            events,
        };
        let seconds = timeline.makespan() / 1e3;
        Some(StepRecord {
            step,
            loss,
            seconds,
            timeline,
            peak_stash,
            peak_stash_bytes,
            kept_per_microbatch,
            optimizer_state_bytes,
            memory,
            origin_ms: t0,
        })
    }
}
