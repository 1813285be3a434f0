//! Train the reference GPT over a mesh with any valid timetable.

use std::sync::Arc;

use pipewright_kernels::gpt::GptConfig;
use pipewright_kernels::layers::TpShard;
use pipewright_kernels::{Backend, Cpu};
use pipewright_schedule::{Checked, Timetable};

use crate::batch::MicrobatchId;
use crate::data::{progression_batch, TokenBatch};
use crate::error::RuntimeError;
use crate::mesh::{Coord, Mesh};
use crate::module::{GptModule, ModuleError};
use crate::options::RunOptions;
use crate::run::{run, FinalParams, StepRecord};

/// A training run of the reference GPT.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Pipeline x tensor x data degrees; `mesh.pp` must equal the timetable's devices.
    pub mesh: Mesh,
    /// Model size.
    pub model: GptConfig,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Sequence parallelism with TP (Korthikanti et al. 2022): each TP rank keeps its
    /// `seq_len / tp` slice of the residual stream, the norms and the pipeline hand-offs;
    /// `seq_len` must be divisible by `tp`. A no-op with `tp = 1`.
    pub sequence_parallel: bool,
    /// Seed of the weights and the data.
    pub seed: u64,
    /// Steps, timeout, optimizer.
    pub run: RunOptions,
}

impl TrainConfig {
    /// Sequences in one global batch: `dp * m * microbatch_size`.
    pub fn global_batch(&self, microbatches: u32) -> usize {
        self.mesh.dp * microbatches as usize * self.microbatch_size
    }
}

/// Microbatch `id` of the reference GPT's data: global microbatch `id.global()` of the
/// step (so data-parallel ranks train on disjoint parts of the global batch, and one device
/// going through all of them sees the same data).
pub fn gpt_data(cfg: &TrainConfig, id: MicrobatchId) -> TokenBatch {
    let (tokens, targets) = progression_batch(
        cfg.seed,
        id.step,
        id.global(),
        cfg.microbatch_size,
        cfg.model.seq_len,
        cfg.model.vocab,
    );
    TokenBatch { tokens, targets }
}

/// Train; `on_step` sees every step (loss, timeline) as it completes. Returns the final
/// parameters of every stage and TP shard.
pub fn train_gpt(
    cfg: &TrainConfig,
    tt: &Checked,
    on_step: impl FnMut(&StepRecord),
) -> Result<FinalParams, RuntimeError> {
    let g = GptRun::new(cfg, tt)?;
    let cpu = Arc::new(Cpu::new(cfg.run.precision));
    run(
        cfg.mesh,
        tt,
        |c, stage| g.module(&cpu, c, stage),
        |id| Ok(gpt_data(g.cfg, id)),
        &cfg.run,
        on_step,
    )
}

/// Train on GPU `ordinal` (feature `cuda`) in `cfg.run.precision`: every rank of the mesh is
/// a thread of this process with its own stream on that one GPU, and the CUDA-local transport
/// hands tensors over by device-to-device copies, so activations, gradients and optimizer
/// state never leave the GPU. The whole GPU path (pipeline, TP and DP) runs on a single-GPU machine.
#[cfg(feature = "cuda")]
pub fn train_gpt_cuda(
    cfg: &TrainConfig,
    tt: &Checked,
    ordinal: usize,
    on_step: impl FnMut(&StepRecord),
) -> Result<FinalParams, RuntimeError> {
    let g = GptRun::new(cfg, tt)?;
    crate::run_cuda::run_cuda_local(
        cfg.mesh,
        tt,
        ordinal,
        |c, stage, be| g.module(be, c, stage),
        |id| Ok(gpt_data(g.cfg, id)),
        &cfg.run,
        on_step,
    )
}

/// Train as rank `rank` of a run over NCCL (feature `nccl`), one process (or thread) per
/// GPU: `backend` is this rank's GPU (in `cfg.run.precision`, else an error) and `ids`
/// shares the communicators' ids (over MPI, or files in a directory every rank sees). `on_outcome` sees this rank's steps. Returns this
/// rank's final parameters.
#[cfg(feature = "nccl")]
pub fn train_gpt_nccl_rank(
    cfg: &TrainConfig,
    tt: &Checked,
    rank: usize,
    backend: Arc<pipewright_kernels::cuda::CudaBackend>,
    ids: &mut dyn crate::comm::rendezvous::Rendezvous,
    on_outcome: impl FnMut(u64, crate::executor::StepOutcome) -> Result<(), RuntimeError>,
) -> Result<FinalParams, RuntimeError> {
    let g = GptRun::new(cfg, tt)?;
    crate::run_nccl::run_nccl_rank(
        cfg.mesh,
        tt,
        rank,
        backend,
        ids,
        |c, stage, be| g.module(be, c, stage),
        |id| Ok(gpt_data(g.cfg, id)),
        &cfg.run,
        on_outcome,
    )
}

/// Train with this process as one rank of an MPI world of `pp * tp * dp` processes (feature
/// `mpi`). `on_step` runs on rank 0, which returns every stage's final parameters; the other
/// ranks return `None`. Every rank must be given the same configuration and timetable: a
/// fingerprint of them is compared at start.
#[cfg(feature = "mpi")]
pub fn train_gpt_mpi(
    universe: mpi::environment::Universe,
    cfg: &TrainConfig,
    tt: &Checked,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>, RuntimeError> {
    let g = GptRun::new(cfg, tt)?;
    let cpu = Arc::new(Cpu::new(cfg.run.precision));
    crate::run_mpi::run_mpi(
        universe,
        cfg.mesh,
        tt,
        |c, stage| g.module(&cpu, c, stage),
        |id| Ok(gpt_data(g.cfg, id)),
        &cfg.run,
        &describe(cfg),
        on_step,
    )
}

/// Train with this process as one rank of an MPI world of `pp * tp * dp` processes, one per
/// GPU (features `nccl` and `mpi`): each rank on the GPU of its local rank, tensors moved by
/// NCCL, everything else as [`train_gpt_mpi`] (start-up checks, records gathered on rank 0,
/// which returns every stage's final parameters).
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub fn train_gpt_nccl_mpi(
    universe: mpi::environment::Universe,
    cfg: &TrainConfig,
    tt: &Checked,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>, RuntimeError> {
    let g = GptRun::new(cfg, tt)?;
    crate::run_nccl_mpi::run_nccl_mpi(
        universe,
        cfg.mesh,
        tt,
        |c, stage, be| g.module(be, c, stage),
        |id| Ok(gpt_data(g.cfg, id)),
        &cfg.run,
        &describe(cfg),
        on_step,
    )
}

/// What every rank of a multi-process run must agree on beyond the timetable and mesh.
#[cfg(feature = "mpi")]
fn describe(cfg: &TrainConfig) -> String {
    format!(
        "{:?} seed {} microbatch size {} sequence parallel {}",
        cfg.model, cfg.seed, cfg.microbatch_size, cfg.sequence_parallel
    )
}

/// A checked GPT run: what every transport needs to build a rank's stages and batches.
struct GptRun<'a> {
    cfg: &'a TrainConfig,
    stages: usize,
}

impl<'a> GptRun<'a> {
    /// Errors when the model does not fit the mesh or the timetable.
    fn new(cfg: &'a TrainConfig, tt: &Timetable) -> Result<Self, RuntimeError> {
        cfg.model
            .validate(cfg.mesh.tp)
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        let stages = tt.num_stages() as usize;
        if stages > cfg.model.n_layers {
            return Err(RuntimeError::Model(format!(
                "{stages} stages need at least {stages} layers (the model has {})",
                cfg.model.n_layers
            )));
        }
        let (seq, tp) = (cfg.model.seq_len, cfg.mesh.tp);
        if cfg.sequence_parallel && seq % tp != 0 {
            return Err(RuntimeError::Model(format!(
                "sequence parallelism cuts each sequence into tp = {tp} slices, but the \
                 sequence length {seq} is not divisible by {tp}"
            )));
        }
        let ep = cfg.mesh.ep;
        if ep > 1 {
            let experts = cfg.model.moe.as_ref().map(|m| m.experts);
            match experts {
                None => {
                    return Err(RuntimeError::Model(format!(
                        "ep = {ep} shards the experts of mixtures, but the model has none"
                    )))
                }
                Some(e) if e % ep != 0 => {
                    return Err(RuntimeError::Model(format!(
                        "ep = {ep} must divide the model's {e} experts"
                    )))
                }
                Some(_) => {}
            }
        }
        if cfg.microbatch_size == 0 {
            // The config's field, as the other checks here name theirs (the faces refuse a
            // microbatch size of 0 in their own words before a run is built).
            return Err(RuntimeError::Model(
                "microbatch_size must be at least 1".into(),
            ));
        }
        Ok(GptRun { cfg, stages })
    }

    /// Stage `stage`, TP shard of `c`, on `be`: the same weights on any backend.
    fn module<B: Backend>(
        &self,
        be: &Arc<B>,
        c: Coord,
        stage: u32,
    ) -> Result<GptModule<B>, ModuleError> {
        let cfg = self.cfg;
        // The transports build the backends; a backend in another precision than the run's
        // would train, silently, in the wrong one.
        if be.precision() != cfg.run.precision {
            return Err(format!(
                "the {} backend computes in {}, the run asks for {}",
                be.name(),
                be.precision(),
                cfg.run.precision
            )
            .into());
        }
        let shard = TpShard::new(c.tp, cfg.mesh.tp)?;
        let mut m = GptModule::on(be, &cfg.model, cfg.seed, stage as usize, self.stages, shard)?;
        m.stage
            .set_sequence_parallel(cfg.sequence_parallel.then_some(shard))?;
        // Under expert parallelism, replica `dp` holds EP rank `dp % ep`'s experts.
        let ep = cfg.mesh.ep;
        if ep > 1 {
            m.stage.shard_experts(TpShard::new(c.dp % ep, ep)?)?;
        }
        Ok(m)
    }
}
