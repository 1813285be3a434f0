//! One rank of a run over NCCL (feature `nccl`): the seam a GPU launcher builds on.
//!
//! The process (one per GPU, e.g. under mpirun) gives its rank, its GPU's backend and a
//! [`Rendezvous`] for the communicators' ids; this runs the rank's row exactly as a thread of
//! the in-process run does (`run_rank`), on this thread (NCCL's communicators are not
//! `Send`). Gathering every rank's step records onto one rank is the launcher's business
//! (over MPI, as `run_mpi` does); each rank's events are timed from its own start.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use pipewright_kernels::cuda::{CudaBackend, CudaTensor};
use pipewright_schedule::Checked;

use crate::batch::MicrobatchId;
use crate::comm::nccl::{NcclComm, NcclSetup};
use crate::comm::rendezvous::Rendezvous;
use crate::comm::Communicator;
use crate::error::RuntimeError;
use crate::executor::StepOutcome;
use crate::mesh::{Coord, Mesh};
use crate::module::{ModuleError, StageModule};
use crate::options::RunOptions;
use crate::run::{prepare, run_rank, FinalParams, RankContext};

/// Run `opts.steps` steps of `tt` as rank `rank` of `mesh` over NCCL on `backend`'s GPU.
/// `make(coord, stage, backend)` builds this rank's modules on the same backend (and so the
/// same compute stream); `on_outcome` sees each of this rank's steps. Returns this rank's
/// final parameters (DP 0 ranks; others none). Fails at start, before any step, when a
/// library is missing, the ids cannot be shared, or the timetable's SEND and RECV orders
/// differ on a link.
#[allow(clippy::too_many_arguments)]
pub fn run_nccl_rank<M, MF, DF, OF>(
    mesh: Mesh,
    tt: &Checked,
    rank: usize,
    backend: Arc<CudaBackend>,
    rendezvous: &mut dyn Rendezvous,
    make: MF,
    data: DF,
    opts: &RunOptions,
    on_outcome: OF,
) -> Result<FinalParams, RuntimeError>
where
    M: StageModule<Tensor = CudaTensor>,
    MF: Fn(Coord, u32, &Arc<CudaBackend>) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
    OF: FnMut(u64, StepOutcome) -> Result<(), RuntimeError>,
{
    let rank = NcclRank {
        mesh,
        rank,
        backend,
        opts,
        time_zero: &Instant::now,
    };
    rank.run(tt, rendezvous, make, data, on_outcome)
}

/// One rank of an NCCL run, before its communicators exist.
pub(crate) struct NcclRank<'a> {
    pub(crate) mesh: Mesh,
    pub(crate) rank: usize,
    pub(crate) backend: Arc<CudaBackend>,
    pub(crate) opts: &'a RunOptions,
    /// Called once the communicators exist, before the first step: this rank's time zero.
    /// A launcher that can (MPI) makes it a barrier, so every rank's events share one clock.
    pub(crate) time_zero: &'a dyn Fn() -> Instant,
}

impl NcclRank<'_> {
    /// Connect (every communicator of the run, ids through `rendezvous`) and run every step.
    pub(crate) fn run<M, MF, DF, OF>(
        self,
        tt: &Checked,
        rendezvous: &mut dyn Rendezvous,
        make: MF,
        data: DF,
        on_outcome: OF,
    ) -> Result<FinalParams, RuntimeError>
    where
        M: StageModule<Tensor = CudaTensor>,
        MF: Fn(Coord, u32, &Arc<CudaBackend>) -> Result<M, ModuleError>,
        DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
        OF: FnMut(u64, StepOutcome) -> Result<(), RuntimeError>,
    {
        let (mesh, rank, opts) = (self.mesh, self.rank, self.opts);
        let tt = prepare(tt, &mesh)?;
        let coord = mesh.coord(rank)?;
        let setup = NcclSetup {
            mesh,
            tt: &tt,
            rank,
            backend: Arc::clone(&self.backend),
            timeout: opts.timeout,
        };
        let comm = Rc::new(
            NcclComm::new(setup, rendezvous).map_err(|e| RuntimeError::Transport(e.to_string()))?,
        );
        let ctx = RankContext {
            mesh,
            coord,
            tt: &tt,
            opts,
            epoch: (self.time_zero)(),
        };
        let backend = self.backend;
        let make = |c: Coord, s: u32| make(c, s, &backend);
        let result =
            run_rank(Rc::clone(&comm), &ctx, &make, &data, on_outcome).and_then(|params| {
                // Dropping the communicators aborts them: let the last sends land first.
                comm.finish()
                    .map_err(|e| RuntimeError::Transport(e.to_string()))?;
                Ok(params)
            });
        if let Err(e) = &result {
            comm.abort(&e.to_string());
        }
        result
    }
}
