//! NCCL runs launched by `mpirun` (features `nccl` and `mpi`): one process per GPU.
//!
//! MPI is the control plane and NCCL the data plane. Over MPI the ranks do what a
//! `--transport mpi` run does ([`run_mpi`](crate::run_mpi())'s start-up, gathering and failure
//! handling, shared through `run_mpi`'s helpers): check the world size and a fingerprint,
//! agree on a time zero, gather step outcomes and final parameters on rank 0, and tell every
//! rank when one fails. NCCL's unique ids travel over MPI too ([`MpiRendezvous`]); tensors
//! move only over NCCL.
//!
//! Before any NCCL call every rank opens its GPU and the ranks compare results: an id
//! broadcast, or `ncclCommInitRank` (which has no timeout), would otherwise wait forever for
//! a rank that gave up.
//!
//! Not run on a GPU yet (none has been lent to this project's sessions); compile-checked.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use mpi::collective::CommunicatorCollectives;
use mpi::environment::Universe;
use pipewright_kernels::cuda::{CudaBackend, CudaTensor};
use pipewright_kernels::Precision;
use pipewright_schedule::Checked;

use crate::batch::MicrobatchId;
use crate::comm::mpi::MpiComm;
use crate::comm::rendezvous::MpiRendezvous;
use crate::comm::Communicator as _;
use crate::error::RuntimeError;
use crate::local_gpu::{choose_gpu, LOCAL_RANK_VAR};
use crate::mesh::{Coord, Mesh};
use crate::module::{ModuleError, StageModule};
use crate::options::RunOptions;
use crate::run::{FinalParams, RankContext, StepRecord};
use crate::run_mpi::{end, guarded, start, time_zero, Gather};
use crate::run_nccl::NcclRank;

/// Run `opts.steps` steps of `tt` over `mesh` with this process one rank of the MPI world
/// (whose size must be the mesh's) and its tensors on its GPU (see
/// [`choose_gpu`]), moved between ranks by NCCL. Arguments as
/// [`run_mpi`](crate::run_mpi()), except that `make(coord, stage, backend)` builds a stage
/// on this rank's GPU. `on_step` runs on rank 0, which returns every stage's final
/// parameters; the other ranks return `None`. A rank without the CUDA or NCCL libraries or
/// without a GPU fails at start with a line saying what is missing, and every other rank
/// fails with it.
#[allow(clippy::too_many_arguments)]
pub fn run_nccl_mpi<M, MF, DF, CB>(
    universe: Universe,
    mesh: Mesh,
    tt: &Checked,
    make: MF,
    data: DF,
    opts: &RunOptions,
    describe: &str,
    on_step: CB,
) -> Result<Option<FinalParams>, RuntimeError>
where
    M: StageModule<Tensor = CudaTensor>,
    MF: Fn(Coord, u32, &Arc<CudaBackend>) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
    CB: FnMut(&StepRecord),
{
    // A CPU rank and a GPU rank of otherwise equal runs must not meet.
    let describe = format!("{describe} | tensors over NCCL");
    let (comm, tt) = start(universe, mesh, tt, opts, &describe)?;
    let rank = comm.rank();
    let coord = mesh.coord(rank)?;
    let backend = agree(&comm, open_gpu(rank, opts.precision))?;
    let comm = Rc::new(comm);
    let result = guarded(&comm, coord, || {
        // Gathering reads the mesh, the timetable and the steps; the epoch it carries is unused.
        let ctx = RankContext {
            mesh,
            coord,
            tt: &tt,
            opts,
            epoch: Instant::now(),
        };
        let mut gather = Gather::new(&comm, &ctx, on_step);
        let mut ids = MpiRendezvous::new(comm.world());
        let zero = || time_zero(&comm);
        let nccl = NcclRank {
            mesh,
            rank,
            backend,
            opts,
            time_zero: &zero,
        };
        let params = nccl.run(&tt, &mut ids, make, data, |step, outcome| {
            gather.outcome(step, outcome)
        })?;
        gather.finish(params)
    });
    end(comm, result)
}

/// This rank's GPU, or one line saying what is missing. The libraries are checked first:
/// cudarc panics on a call into a library that is not there.
fn open_gpu(rank: usize, precision: Precision) -> Result<Arc<CudaBackend>, String> {
    if let Some(why) = crate::comm::nccl::missing_library() {
        return Err(why);
    }
    let devices = cudarc::driver::CudaContext::device_count()
        .map_err(|e| format!("CUDA cannot count the GPUs: {e:?}"))?;
    let local = std::env::var(LOCAL_RANK_VAR).ok();
    let gpu =
        choose_gpu(local.as_deref(), rank, devices.max(0) as usize).map_err(|e| e.to_string())?;
    CudaBackend::new(gpu)
        .map(|b| Arc::new(b.with_precision(precision)))
        .map_err(|e| format!("GPU {gpu}: {e}"))
}

/// Every rank learns whether every rank opened its GPU (one all-gather), so all go on or
/// all stop: a rank that failed reports its own reason, the others name the first rank that
/// failed.
fn agree(
    comm: &MpiComm,
    mine: Result<Arc<CudaBackend>, String>,
) -> Result<Arc<CudaBackend>, RuntimeError> {
    let ok = u8::from(mine.is_ok());
    let mut all = vec![0u8; comm.world_size()];
    comm.world().all_gather_into(&ok, &mut all[..]);
    let rank = comm.rank();
    match (mine, all.iter().position(|&o| o == 0)) {
        (Err(why), _) => Err(RuntimeError::Transport(format!("rank {rank}: {why}"))),
        (Ok(_), Some(first)) => Err(RuntimeError::Transport(format!(
            "rank {first} could not open its GPU (its error names why); stopping with it"
        ))),
        (Ok(backend), None) => Ok(backend),
    }
}
