//! Run a timetable with every rank on one GPU (feature `cuda`): ranks as threads, each with
//! a stream of its own, over the CUDA-local transport ([`crate::comm::cuda_local`]); the
//! launcher beside `run_mpi.rs` and the NCCL ones.

use std::sync::Arc;

use pipewright_kernels::cuda::{CudaBackend, CudaTensor};
use pipewright_schedule::Checked;

use crate::batch::MicrobatchId;
use crate::comm::cuda_local::CudaOps;
use crate::error::RuntimeError;
use crate::mesh::{Coord, Mesh};
use crate::module::{ModuleError, StageModule};
use crate::options::RunOptions;
use crate::run::{run_local, FinalParams, StepRecord};

/// Run `tt` over `mesh` with every rank on GPU `ordinal`, each rank a thread with a stream
/// of its own (the CUDA-local transport). `make(coord, stage, backend)` builds a rank's
/// module on that rank's backend, so its kernels and its messages share one stream. The rest
/// is [`run`](crate::run()).
pub fn run_cuda_local<M, MF, DF, CB>(
    mesh: Mesh,
    tt: &Checked,
    ordinal: usize,
    make: MF,
    data: DF,
    opts: &RunOptions,
    on_step: CB,
) -> Result<FinalParams, RuntimeError>
where
    M: StageModule<Tensor = CudaTensor>,
    MF: Fn(Coord, u32, &Arc<CudaBackend>) -> Result<M, ModuleError> + Sync,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError> + Sync,
    CB: FnMut(&StepRecord),
{
    let base = CudaBackend::new(ordinal)
        .map_err(|e| RuntimeError::Transport(e.to_string()))?
        .with_precision(opts.precision);
    let ops = |_rank: usize| -> Result<CudaOps, ModuleError> {
        Ok(CudaOps::new(Arc::new(base.on_new_stream()?)))
    };
    let make = |c: Coord, s: u32, ops: &CudaOps| make(c, s, ops.backend());
    run_local(mesh, tt, ops, make, data, opts, on_step)
}
