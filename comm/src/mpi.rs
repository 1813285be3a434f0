//! The MPI transport: one process per rank, over rsmpi and the system's MPI (feature `mpi`).
//!
//! Point-to-point: a message is a small header (the full [`Tag`] and the shape, as `u64`s)
//! and a payload (the tensor's `f32`s, sent from and received into the tensor's own buffer,
//! so the transport adds no copy). Both travel with an MPI tag that packs direction, stage,
//! microbatch and the step modulo what fits under `MPI_TAG_UB` ([`TagLayout`]); the header's
//! full tag is checked on arrival, so two messages could only be confused loudly, never
//! silently. Receives are futures that poll (`MPI_Improbe`, then `MPI_Imrecv` and `MPI_Test`)
//! and yield between polls, so the executor's posted-early receives never block its thread.
//!
//! Collectives run on one sub-communicator per mesh group, split from the world at start.
//! An all-reduce is an `MPI_Iallgather` followed by a sum in group order with the same
//! function as the local transport: MPI's own reduction order is unspecified (it differs with
//! the algorithm and the group size), and the project's correctness bar is equality with the
//! in-process run, to the bit. For the 2-rank groups of most meshes this moves the same bytes
//! as `MPI_Allreduce`; larger groups move `n/2` times more.
//!
//! Failures: every wait checks between polls: an abort notice from another rank (sent by
//! [`Communicator::abort`] on its own communicator), the deadline (giving
//! [`CommError::Timeout`]), for peers on this host whether their process still exists (giving
//! [`CommError::PeerLost`] at once instead of after the timeout), and whether mpirun has sent
//! SIGTERM (which it does to every rank when one dies; see `sigterm`).

mod peers;
mod raw;
mod wait;
mod wire;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::raw::c_int;
use std::time::{Duration, Instant};

pub use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::Threading;
use pipewright_kernels::{DType, Tensor};

use self::peers::{host_id, sigterm, Peer};
use self::raw::{Flight, Matched};
pub use self::wire::TagLayout;
use self::wire::{header, parse_header};
use super::{check_shard, reduce_in_order, shard_range, CommError, Communicator, ReduceOp, Tag};
use crate::mesh::{Group, GroupKind, Mesh};

/// How long a failing rank waits for its abort notices to leave, and how long a rank that
/// finds a peer's process gone looks for that peer's notice before naming the exit as the
/// cause. Only failures pay it.
const NOTICE_GRACE: Duration = Duration::from_millis(200);

/// Tag of abort notices on the control communicator.
const ABORT_TAG: c_int = 1;
/// Most dimensions a gathered tensor may have (the shape travels in a fixed-size block).
const MAX_DIMS: usize = 8;
/// After anything arrives, poll without sleeping (but yielding the core) for this long, then
/// nap between polls. Spinning longer lowers latency when every rank has a core of its own
/// (10 ms: bench +2.0% to +3.7% on this 2-core machine against +3.7% to +10.7% with 1 ms,
/// paired runs), but on an oversubscribed or CPU-capped machine it burns the CPU the
/// computing ranks need (the VM's steal time reached 26%). 1 ms is the cautious middle.
const SPIN: Duration = Duration::from_millis(1);
/// Then nap this long between rounds of polls, so idle ranks leave the cores to busy ones.
const NAP: Duration = Duration::from_micros(20);
/// Waiting ranks look at MPI at most this often (see `MpiComm::sweep`).
const SWEEP_EVERY: Duration = Duration::from_micros(2);
/// How often a waiting rank checks that its peers' processes are alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// Start MPI in this process (once). The executor calls MPI from one thread only.
pub fn init() -> Result<Universe, CommError> {
    mpi::initialize_with_threading(Threading::Funneled)
        .map(|(u, _)| u)
        .ok_or_else(|| CommError::Invalid("MPI is already initialised in this process".into()))
}

/// This process's rank in the MPI world.
pub fn world_rank(universe: &Universe) -> usize {
    universe.world().rank() as usize
}

/// Anything in flight that only needs to finish (sends, abort notices).
trait Finish {
    fn finished(&mut self) -> Result<bool, CommError>;
}

impl<B> Finish for Flight<B> {
    fn finished(&mut self) -> Result<bool, CommError> {
        self.test()
    }
}

/// One process's communicator over MPI.
pub struct MpiComm {
    rank: usize,
    size: usize,
    tags: TagLayout,
    timeout: Duration,
    peers: Vec<Peer>,
    host: u64,
    sends: RefCell<Vec<Box<dyn Finish>>>,
    aborted: RefCell<Option<String>>,
    last_progress: Cell<Instant>,
    last_nap: Cell<Instant>,
    last_liveness: Cell<Instant>,
    last_sweep: Cell<Instant>,
    /// Point-to-point messages that arrived before their receive asked, by (source, tag).
    mailbox: RefCell<HashMap<(usize, c_int), VecDeque<Matched>>>,
    /// One sub-communicator per group this rank is in, with the group's ranks.
    groups: HashMap<(GroupKind, usize), (SimpleCommunicator, Vec<usize>)>,
    /// Tensors between pipeline stages.
    p2p: SimpleCommunicator,
    /// What a pipeline payload travels as ([`MpiComm::with_wire`]).
    wire: DType,
    /// Abort notices.
    ctl: SimpleCommunicator,
    /// Records for rank 0 (step outcomes, final parameters): kept apart from tensors.
    rec: SimpleCommunicator,
    world: SimpleCommunicator,
    /// Dropped last: dropping it finalises MPI.
    _universe: Universe,
}

/// A started all-reduce or reduce-scatter: the parts arrive as blocks of `stride` values,
/// one per rank in group order, of which the first `shape`'s worth are summed.
pub struct MpiPending {
    flight: raw::Gathered<f32>,
    shape: Vec<usize>,
    stride: usize,
    op: ReduceOp,
    members: Vec<usize>,
}

impl MpiComm {
    /// Pipeline payloads (not collectives, which sum in f32) travel as `dtype`: `BF16` in a
    /// bf16 run, half the bytes of f32. Both ends of every link must agree (`run_mpi`'s
    /// fingerprint holds the precision); f16 is not a wire format and sends f32.
    pub fn with_wire(mut self, dtype: DType) -> Self {
        self.wire = dtype;
        self
    }

    /// The communicator of this process for `mesh`, whose size must be the MPI world's;
    /// `stages` and `microbatches` bound the tags. Collective over the world: every rank
    /// creates its communicator at start, in the same order.
    pub fn new(
        universe: Universe,
        mesh: Mesh,
        stages: u32,
        microbatches: u32,
        timeout: Duration,
    ) -> Result<MpiComm, CommError> {
        let world = universe.world();
        raw::errors_return(world.as_raw())?;
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Mesh::for_world(size, mesh.pp, mesh.tp, mesh.dp)
            .map_err(|e| CommError::Invalid(e.to_string()))?;
        let tags = TagLayout::new(stages, microbatches, raw::tag_upper_bound(world.as_raw()))?;
        let mut groups = HashMap::new();
        for kind in [
            GroupKind::Tp,
            GroupKind::Dp,
            GroupKind::Pp,
            GroupKind::World,
            GroupKind::Ep,
            GroupKind::ExpertDp,
        ] {
            let g = mesh
                .group(kind, rank)
                .map_err(|e| CommError::Invalid(e.to_string()))?;
            let key = g.position(rank).unwrap_or(0) as i32;
            let sub = world
                .split_by_color_with_key(Color::with_value(g.index as i32), key)
                .ok_or_else(|| CommError::Invalid(format!("no communicator for {kind:?}")))?;
            groups.insert((kind, g.index), (sub, g.ranks));
        }
        sigterm::catch();
        let host = host_id();
        let pid = u64::from(std::process::id());
        let mut all = vec![0u64; 2 * size];
        mpi::collective::CommunicatorCollectives::all_gather_into(
            &world,
            &[host, pid][..],
            &mut all[..],
        );
        let peers = all
            .chunks(2)
            .map(|c| Peer {
                host: c[0],
                pid: c[1],
            })
            .collect();
        let now = Instant::now();
        Ok(MpiComm {
            rank,
            size,
            tags,
            timeout,
            peers,
            host,
            sends: RefCell::new(Vec::new()),
            aborted: RefCell::new(None),
            last_progress: Cell::new(now),
            last_nap: Cell::new(now),
            last_liveness: Cell::new(now),
            last_sweep: Cell::new(now),
            mailbox: RefCell::new(HashMap::new()),
            groups,
            p2p: world.duplicate(),
            wire: DType::F32,
            ctl: world.duplicate(),
            rec: world.duplicate(),
            world,
            _universe: universe,
        })
    }

    /// The MPI world (for code that talks plain MPI next to the transport, like benchmarks).
    pub fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// Wait until every send of this rank has been delivered (or the timeout passes).
    pub fn flush(&self) -> Result<(), CommError> {
        let deadline = Instant::now() + self.timeout;
        while !self.reap_sends()? {
            self.sweep()?;
            if Instant::now() >= deadline {
                return Err(self.timeout_error("delivery of this rank's last sends".into()));
            }
        }
        Ok(())
    }

    fn position(&self, group: &Group) -> Result<usize, CommError> {
        group.position(self.rank).ok_or_else(|| {
            CommError::Invalid(format!(
                "rank {} is not in group {:?}",
                self.rank, group.ranks
            ))
        })
    }

    fn group_comm(&self, group: &Group) -> Result<&SimpleCommunicator, CommError> {
        self.check_abort()?;
        match self.groups.get(&(group.kind, group.index)) {
            Some((comm, ranks)) if *ranks == group.ranks => Ok(comm),
            _ => Err(CommError::Invalid(format!(
                "rank {} is not in group {:?} {:?} of this mesh",
                self.rank, group.kind, group.ranks
            ))),
        }
    }

    /// Send bytes to rank 0 on the records communicator (step outcomes, parameters).
    pub fn send_record(&self, tag: c_int, bytes: Vec<u8>) -> Result<(), CommError> {
        let f = raw::isend(self.rec.as_raw(), bytes, 0, tag)?;
        self.sends.borrow_mut().push(Box::new(f));
        Ok(())
    }

    /// A record with `tag` from any rank, if one has arrived (rank 0).
    pub fn try_record(&self, tag: c_int) -> Result<Option<(usize, Vec<u8>)>, CommError> {
        self.check_abort()?;
        let Some(m) = raw::improbe(self.rec.as_raw(), ffi_any_source(), tag)? else {
            return Ok(None);
        };
        let src = m.src as usize;
        let what = || format!("a record from rank {src}");
        let bytes = self.wait_sync(raw::imrecv::<u8>(m)?, &what)?.into_vec();
        Ok(Some((src, bytes)))
    }

    /// Wait for a record with `tag` from any rank, watching every rank (rank 0).
    pub fn record(&self, tag: c_int) -> Result<(usize, Vec<u8>), CommError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(r) = self.try_record(tag)? {
                return Ok(r);
            }
            self.sweep()?;
            if Instant::now() >= deadline {
                return Err(self.timeout_error("the other ranks' step records".into()));
            }
        }
    }
}

fn ffi_any_source() -> c_int {
    // SAFETY: reads a constant exported by rsmpi's C shim.
    unsafe { mpi::ffi::RSMPI_ANY_SOURCE }
}

fn tensor(shape: &[usize], data: Vec<f32>) -> Result<Tensor, CommError> {
    Tensor::new(shape, data).map_err(|e| CommError::Invalid(e.to_string()))
}

impl Communicator for MpiComm {
    type Tensor = Tensor;
    type Pending = MpiPending;

    fn all_reduce(&self, group: &Group, t: &mut Tensor, op: ReduceOp) -> Result<(), CommError> {
        super::host_all_reduce(self, group, t, op)
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(&self, dst: usize, tag: Tag, tensor: Tensor) -> Result<(), CommError> {
        if dst >= self.size {
            return Err(CommError::Invalid(format!(
                "send to rank {dst} of {}",
                self.size
            )));
        }
        self.check_abort()?;
        self.reap_sends()?;
        let (head, body) = (self.tags.encode(tag, false)?, self.tags.encode(tag, true)?);
        let h = raw::isend(
            self.p2p.as_raw(),
            header(tag, tensor.shape()),
            dst as c_int,
            head,
        )?;
        let d: Box<dyn Finish> = match self.wire {
            // bf16 bytes (rounded to nearest even): half the bytes, and exact for what a
            // bf16 run hands over, since its stages round to bf16 already.
            DType::BF16 => {
                let bytes = tensor.to_bytes(DType::BF16);
                Box::new(raw::isend(self.p2p.as_raw(), bytes, dst as c_int, body)?)
            }
            _ => Box::new(raw::isend(
                self.p2p.as_raw(),
                tensor.into_data(),
                dst as c_int,
                body,
            )?),
        };
        let mut sends = self.sends.borrow_mut();
        sends.push(Box::new(h));
        sends.push(d);
        Ok(())
    }

    async fn recv(&self, src: usize, tag: Tag) -> Result<Tensor, CommError> {
        if src >= self.size {
            return Err(CommError::Invalid(format!(
                "receive from rank {src} of {}",
                self.size
            )));
        }
        let (head, body) = (self.tags.encode(tag, false)?, self.tags.encode(tag, true)?);
        let m = self.matched(src, head).await?;
        let h = self.wait_async(raw::imrecv::<u64>(m)?).await?.into_vec();
        let shape = parse_header(&h, tag, src)?;
        let m = self.matched(src, body).await?;
        let data = match self.wire {
            DType::BF16 => {
                let bytes = self.wait_async(raw::imrecv::<u8>(m)?).await?.into_vec();
                return Tensor::from_bytes(&shape, DType::BF16, &bytes)
                    .map_err(|e| CommError::Invalid(format!("from rank {src}: {e}")));
            }
            _ => self.wait_async(raw::imrecv::<f32>(m)?).await?.into_vec(),
        };
        tensor(&shape, data)
    }

    fn start_all_reduce(
        &self,
        group: &Group,
        tensor: Tensor,
        op: ReduceOp,
    ) -> Result<MpiPending, CommError> {
        let comm = self.group_comm(group)?;
        let shape = tensor.shape().to_vec();
        let stride = tensor.numel();
        let flight = raw::iallgather(comm.as_raw(), tensor.into_data(), group.size())?;
        Ok(MpiPending {
            flight,
            shape,
            stride,
            op,
            members: group.ranks.clone(),
        })
    }

    /// Waits for either collective; both sum in group order with `reduce_in_order`.
    fn wait_all_reduce(&self, p: MpiPending) -> Result<Tensor, CommError> {
        let (_, all) = self.wait_collective(p.flight, &p.members)?;
        let (n, s) = (p.shape.iter().product::<usize>(), p.stride);
        // By index, not `chunks`: a stage without parameters reduces empty tensors.
        let parts = (0..p.members.len())
            .map(|i| tensor(&p.shape, all[i * s..i * s + n].to_vec()))
            .collect::<Result<Vec<_>, _>>()?;
        reduce_in_order(&parts, p.op)
    }

    /// An all-to-all of the flat tensor padded to `n` blocks of `ceil(numel / n)`: each rank
    /// receives only its shard from every rank (1/n of an all-reduce's traffic) and sums
    /// those in group order, so its values are the all-reduce's to the bit.
    fn start_reduce_scatter(
        &self,
        group: &Group,
        t: Tensor,
        op: ReduceOp,
    ) -> Result<MpiPending, CommError> {
        let comm = self.group_comm(group)?;
        let (n, numel) = (group.size(), t.numel());
        let len = shard_range(numel, n, self.position(group)?).len();
        let chunk = numel.div_ceil(n);
        let mut data = t.into_data();
        data.resize(chunk * n, 0.0);
        Ok(MpiPending {
            flight: raw::ialltoall(comm.as_raw(), data, n)?,
            shape: vec![len],
            stride: chunk,
            op,
            members: group.ranks.clone(),
        })
    }

    fn wait_reduce_scatter(&self, p: MpiPending) -> Result<Tensor, CommError> {
        self.wait_all_reduce(p)
    }

    /// An all-gather of the shards padded to `ceil(numel / n)`, then cut back to `numel`.
    fn all_gather_shards(
        &self,
        group: &Group,
        shard: Tensor,
        numel: usize,
    ) -> Result<Tensor, CommError> {
        let comm = self.group_comm(group)?;
        let n = group.size();
        check_shard(shard.numel(), numel, n, self.position(group)?)?;
        let mut data = shard.into_data();
        data.resize(numel.div_ceil(n), 0.0);
        let (_, all) =
            self.wait_collective(raw::iallgather(comm.as_raw(), data, n)?, &group.ranks)?;
        let chunk = numel.div_ceil(n);
        let whole = (0..n).flat_map(|i| {
            let r = shard_range(numel, n, i);
            all[i * chunk..i * chunk + r.len()].iter().copied()
        });
        tensor(&[numel], whole.collect())
    }

    fn numel(&self, t: &Tensor) -> usize {
        t.numel()
    }

    fn all_gather(&self, group: &Group, t: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let comm = self.group_comm(group)?;
        if t.shape().len() > MAX_DIMS {
            return Err(CommError::Invalid(format!(
                "all-gather of a {}-d tensor",
                t.shape().len()
            )));
        }
        // Shapes first (a fixed-size block each), then the data padded to the longest.
        let mut dims = vec![0u64; MAX_DIMS + 1];
        dims[0] = t.shape().len() as u64;
        dims[1..=t.shape().len()]
            .iter_mut()
            .zip(t.shape())
            .for_each(|(d, &s)| *d = s as u64);
        let (_, shapes) = self.wait_collective(
            raw::iallgather(comm.as_raw(), dims, group.size())?,
            &group.ranks,
        )?;
        let shapes: Vec<Vec<usize>> = shapes
            .chunks(MAX_DIMS + 1)
            .map(|c| {
                c[1..=(c[0] as usize).min(MAX_DIMS)]
                    .iter()
                    .map(|&d| d as usize)
                    .collect()
            })
            .collect();
        let longest = shapes
            .iter()
            .map(|s| s.iter().product::<usize>())
            .max()
            .unwrap_or(0);
        let mut data = t.data().to_vec();
        data.resize(longest, 0.0);
        let (_, all) = self.wait_collective(
            raw::iallgather(comm.as_raw(), data, group.size())?,
            &group.ranks,
        )?;
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n = s.iter().product::<usize>();
                tensor(s, all[i * longest..i * longest + n].to_vec())
            })
            .collect()
    }

    fn reduce_scatter(&self, group: &Group, t: &Tensor, op: ReduceOp) -> Result<Tensor, CommError> {
        self.wait_reduce_scatter(self.start_reduce_scatter(group, t.clone(), op)?)
    }

    fn barrier(&self, group: &Group) -> Result<(), CommError> {
        let comm = self.group_comm(group)?;
        self.wait_collective(raw::ibarrier(comm.as_raw())?, &group.ranks)
    }

    fn abort(&self, reason: &str) {
        if self.aborted.borrow().is_some() {
            return;
        }
        *self.aborted.borrow_mut() = Some(reason.to_string());
        for r in (0..self.size).filter(|&r| r != self.rank) {
            // A peer that is gone cannot be told; the others learn from this notice.
            if self.gone(r).is_some() {
                continue;
            }
            if let Ok(f) = raw::isend(
                self.ctl.as_raw(),
                reason.as_bytes().to_vec(),
                r as c_int,
                ABORT_TAG,
            ) {
                self.sends.borrow_mut().push(Box::new(f));
            }
        }
        // Small notices go out eagerly; give them a moment to leave before the caller exits,
        // but only a moment: mpirun may be ending the job, and the caller has yet to report.
        let deadline = Instant::now() + NOTICE_GRACE;
        while !self.reap_sends().unwrap_or(true) && Instant::now() < deadline {
            self.idle();
        }
    }
}
