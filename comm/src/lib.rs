//! Communicators: how ranks move tensors. One trait; `local` (one process, channels) is the
//! embedded default, and MPI and NCCL implement the same trait.
//!
//! The shape fits all three: sends never block (buffered, `MPI_Isend`, a NCCL send on a
//! stream); receives are futures that can be posted early and awaited when needed;
//! collectives can be started and waited on later, so a data-parallel all-reduce overlaps the
//! rest of the step. Nothing requires `Send`: a NCCL communicator lives on one OS thread.
//!
//! The [`mesh`] (`pp x tp x dp` ranks and their groups) lives here because every transport
//! is built from it. Invariants, as absences:
//! - comm does not know modules, stashes, optimizers or the executor: it moves tensors by
//!   [`Tag`] and group, and the runtime (`pipewright-runtime`) depends on it, never the reverse;
//! - comm knows a timetable only as the order of messages on each link ([`links`], which an
//!   order-matched transport such as NCCL checks before its first step).
#![deny(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda_local;
pub mod links;
pub mod local;
pub mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rendezvous;
pub mod timer;

use std::fmt;
use std::ops::Range;

use pipewright_kernels::Tensor;

use crate::mesh::Group;

/// Which way a pipeline tensor travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A stage's output activation, to the next stage.
    Forward,
    /// A stage's input gradient, to the previous stage.
    Backward,
}

/// Identity of a point-to-point message: which step, which way, which stage sent it, which
/// microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// Training step.
    pub step: u64,
    /// Direction.
    pub dir: Direction,
    /// Stage that sent it.
    pub stage: u32,
    /// Microbatch.
    pub microbatch: u32,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = if self.dir == Direction::Forward {
            "activation"
        } else {
            "gradient"
        };
        write!(
            f,
            "{d} of stage {} microbatch {} (step {})",
            self.stage, self.microbatch, self.step
        )
    }
}

/// How a collective combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean over the group.
    Mean,
}

/// Why a communication failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CommError {
    /// Nothing arrived in time.
    #[error("timed out after {secs:.1} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The limit.
        secs: f64,
    },
    /// Another rank failed and stopped the world.
    #[error("stopped because another rank failed: {0}")]
    Aborted(String),
    /// A peer process is gone (it exited or was killed).
    #[error("lost peer rank {rank}: {detail}")]
    PeerLost {
        /// The rank that is gone.
        rank: usize,
        /// How it was noticed.
        detail: String,
    },
    /// Shapes or groups do not fit.
    #[error("{0}")]
    Invalid(String),
    /// The GPU, its driver or NCCL failed.
    #[error("device: {0}")]
    Device(String),
}

/// Combine a group's parts in group order: every transport reduces with this one function, so
/// they agree to the bit (floating-point sums depend on their order).
pub(crate) fn reduce_in_order<'a>(
    parts: impl IntoIterator<Item = &'a Tensor>,
    op: ReduceOp,
) -> Result<Tensor, CommError> {
    let mut iter = parts.into_iter();
    let mut acc = iter
        .next()
        .cloned()
        .ok_or_else(|| CommError::Invalid("empty group".into()))?;
    let mut n = 1usize;
    for t in iter {
        acc.add_assign(t)
            .map_err(|e| CommError::Invalid(format!("all-reduce: {e}")))?;
        n += 1;
    }
    if op == ReduceOp::Mean {
        acc.scale(1.0 / n as f32);
    }
    Ok(acc)
}

/// Where position `pos` of a group of `n` keeps its shard of a flat tensor of `numel` values
/// (reduce-scatter, all-gather of shards, ZeRO-1): contiguous shards of `ceil(numel / n)`
/// values in group order, the last ones shorter (or empty) when `n` does not divide `numel`.
/// Every transport and every module cuts with this one function.
pub fn shard_range(numel: usize, n: usize, pos: usize) -> Range<usize> {
    let chunk = numel.div_ceil(n.max(1));
    let lo = (pos * chunk).min(numel);
    lo..(lo + chunk).min(numel)
}

/// Position `pos`'s shard ([`shard_range`]) of a reduced tensor of a group of `n`.
pub(crate) fn share_of(whole: &Tensor, pos: usize, n: usize) -> Result<Tensor, CommError> {
    let r = shard_range(whole.numel(), n, pos);
    let part = whole.data()[r.clone()].to_vec();
    Tensor::new(&[r.len()], part).map_err(|e| CommError::Invalid(e.to_string()))
}

/// Shards in group order, concatenated into one flat tensor of `numel` values, each checked
/// against [`shard_range`] (an all-gather of shards).
pub(crate) fn concat_shards<'a>(
    parts: impl IntoIterator<Item = &'a Tensor>,
    numel: usize,
) -> Result<Tensor, CommError> {
    let parts: Vec<&Tensor> = parts.into_iter().collect();
    let mut out = Vec::with_capacity(numel);
    for (pos, t) in parts.iter().enumerate() {
        check_shard(t.numel(), numel, parts.len(), pos)?;
        out.extend_from_slice(t.data());
    }
    Tensor::new(&[numel], out).map_err(|e| CommError::Invalid(e.to_string()))
}

/// Refuse a shard whose length is not the one [`shard_range`] gives its position.
pub(crate) fn check_shard(len: usize, numel: usize, n: usize, pos: usize) -> Result<(), CommError> {
    let want = shard_range(numel, n, pos).len();
    if len != want {
        return Err(CommError::Invalid(format!(
            "shard {pos} of {n} of {numel} values holds {len} values, not {want}"
        )));
    }
    Ok(())
}

/// What every transport provides to one rank.
///
/// `Tensor` is what it carries: a host [`Tensor`] for the local and MPI transports, a device
/// tensor for the CUDA ones. The executor needs its stage modules to use the same type.
#[allow(async_fn_in_trait)]
pub trait Communicator {
    /// The tensors this transport moves.
    type Tensor: pipewright_kernels::Shaped;
    /// A collective that has been started and not yet waited on.
    type Pending;

    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Send without blocking; the tensor is owned by the transport from here.
    fn send(&self, dst: usize, tag: Tag, tensor: Self::Tensor) -> Result<(), CommError>;
    /// Receive the message `tag` from `src`. Creating the future posts nothing; the runtime
    /// spawns it early, so transports that need a posted receive get one in time.
    async fn recv(&self, src: usize, tag: Tag) -> Result<Self::Tensor, CommError>;
    /// Start an all-reduce of `tensor` over `group`.
    fn start_all_reduce(
        &self,
        group: &Group,
        tensor: Self::Tensor,
        op: ReduceOp,
    ) -> Result<Self::Pending, CommError>;
    /// Finish a started all-reduce: every rank of the group gets the same result.
    fn wait_all_reduce(&self, pending: Self::Pending) -> Result<Self::Tensor, CommError>;
    /// All-reduce in place. (Required rather than provided: moving the tensor out of `&mut`
    /// needs a placeholder, and only the transport knows how to make one cheaply.)
    fn all_reduce(
        &self,
        group: &Group,
        tensor: &mut Self::Tensor,
        op: ReduceOp,
    ) -> Result<(), CommError>;
    /// Every rank's tensor, in group order.
    fn all_gather(
        &self,
        group: &Group,
        tensor: &Self::Tensor,
    ) -> Result<Vec<Self::Tensor>, CommError>;
    /// Sends `send[i]` to the group's `i`-th rank and returns what each rank of the group sent
    /// to this one, in group order (shapes may differ): expert parallelism's dispatch and
    /// combine. Every rank of the group calls it in the same order.
    ///
    /// Provided as one [`all_gather`](Self::all_gather) per destination, which every
    /// transport whose all-gather takes parts of different shapes (in-process, MPI) runs as
    /// it is: correct, at `n` times an all-to-all's traffic for a group of `n`. A transport
    /// with a native all-to-all overrides it.
    fn all_to_all(
        &self,
        group: &Group,
        send: Vec<Self::Tensor>,
    ) -> Result<Vec<Self::Tensor>, CommError> {
        let pos = group.position(self.rank()).ok_or_else(|| {
            CommError::Invalid(format!(
                "rank {} is not in group {:?} {:?}",
                self.rank(),
                group.kind,
                group.ranks
            ))
        })?;
        if send.len() != group.size() {
            return Err(CommError::Invalid(format!(
                "all-to-all of {} messages over a group of {}",
                send.len(),
                group.size()
            )));
        }
        let mut mine = None;
        for (dst, t) in send.iter().enumerate() {
            let got = self.all_gather(group, t)?;
            if dst == pos {
                mine = Some(got);
            }
        }
        mine.ok_or_else(|| CommError::Invalid("all-to-all: no message for this rank".into()))
    }
    /// Reduce over the group, then keep this rank's shard ([`shard_range`]) of the flat
    /// result.
    fn reduce_scatter(
        &self,
        group: &Group,
        tensor: &Self::Tensor,
        op: ReduceOp,
    ) -> Result<Self::Tensor, CommError>;
    /// Start a reduce-scatter of `tensor` (flat) over `group`: the ZeRO-1 gradient reduction,
    /// overlapped with the rest of the step like [`start_all_reduce`](Self::start_all_reduce).
    /// The sums are those of an all-reduce (the same order), cut by [`shard_range`].
    fn start_reduce_scatter(
        &self,
        group: &Group,
        tensor: Self::Tensor,
        op: ReduceOp,
    ) -> Result<Self::Pending, CommError>;
    /// Finish a started reduce-scatter: this rank's shard of the reduced tensor.
    fn wait_reduce_scatter(&self, pending: Self::Pending) -> Result<Self::Tensor, CommError>;
    /// Every rank's shard of a flat tensor of `numel` values (cut by [`shard_range`]),
    /// concatenated in group order: the ZeRO-1 parameter all-gather.
    fn all_gather_shards(
        &self,
        group: &Group,
        shard: Self::Tensor,
        numel: usize,
    ) -> Result<Self::Tensor, CommError>;
    /// Number of values in `t` (the runtime cuts shards without knowing the tensor type).
    fn numel(&self, t: &Self::Tensor) -> usize;
    /// Wait until every rank of the group is here.
    fn barrier(&self, group: &Group) -> Result<(), CommError>;
    /// Stop every rank: pending and future operations fail with [`CommError::Aborted`].
    fn abort(&self, reason: &str);
}

/// All-reduce a host tensor in place through a transport's start and wait (an empty tensor
/// is the free placeholder).
#[cfg(feature = "mpi")]
pub(crate) fn host_all_reduce<C>(
    comm: &C,
    group: &Group,
    tensor: &mut Tensor,
    op: ReduceOp,
) -> Result<(), CommError>
where
    C: Communicator<Tensor = Tensor> + ?Sized,
{
    let t = std::mem::replace(tensor, Tensor::zeros(&[0]));
    *tensor = comm.wait_all_reduce(comm.start_all_reduce(group, t, op)?)?;
    Ok(())
}
