//! The NCCL communicator (feature `nccl`): one process (or at least one OS thread) per GPU,
//! tensors staying on the device. Compile-checked in CI; see the README for what has run.
//!
//! Communicators: one per mesh group (world, pipeline, DP, TP) and two per directed pipeline
//! link between two ranks, each from its own unique id
//! ([`nccl_plan`](super::links::nccl_plan), ids shared through a
//! [`Rendezvous`](super::rendezvous::Rendezvous)), each with its own stream. NCCL has no
//! tags: the k-th receive on a communicator takes the k-th send, so the timetable's SEND and
//! RECV orders must agree on every link
//! ([`check_link_order`](super::links::check_link_order), refused at start otherwise).
//!
//! Point-to-point: the receiver does not know a message's shape, so a link has a header
//! communicator (tag, payload format and shape, fixed size: `nccl/header.rs`) and a payload
//! communicator. In a bf16 run a pipeline payload travels in the backend's kept form (bf16
//! elements, `ncclBfloat16`: half the bytes; its values are bf16 already, the residual
//! stream being rounded) and is widened on receipt; the header names the format, so the two
//! ends cannot disagree. Collectives carry f32. Receives are posted
//! early on the header stream in the executor's row order; a payload receive is posted once
//! its header has arrived and every earlier payload receive of the link is posted, so payload
//! receives stay in send order too. A link carries one direction only, so a receive posted
//! on a stream can never sit in front of a send its peer waits for; no op waits for another
//! op of the same rank, so none needs a `group_start`/`group_end` pair.
//!
//! Ordering: the compute stream (the rank's backend) records an event before each send or
//! collective and the NCCL stream waits for it; a received payload or reduced tensor is
//! ready on the compute stream once it waits for the NCCL stream's event. Buffers read by a
//! send are kept until its event completes. Waits poll events on the host against the
//! run's timeout, so a lost peer ends in an error, not a hang; collectives wait on the host
//! (simple, and correct whatever the caller does next). NCCL's sums are its own, so results
//! equal the CPU transports' within rounding, not to the bit.
//!
//! Known limits: `ncclCommInitRank` waits for every member without a timeout (the id
//! rendezvous before it does time out); NCCL kernels of several communicators must fit on
//! the GPU together, which they do for the handful of small kernels a rank has in flight.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{Comm, ReduceOp as NcclOp};
use pipewright_kernels::cuda::{CudaBackend, CudaKept, CudaTensor};
use pipewright_kernels::{Backend, Shaped};
mod header;
mod link;
mod setup;

use link::{Keep, LinkEnd};
pub use setup::NcclSetup;

use super::{check_shard, shard_range, CommError, Communicator, ReduceOp, Tag};
use crate::mesh::{Group, GroupKind};

/// How long a waiting rank naps between polls once yielding alone found nothing.
const NAP: Duration = Duration::from_micros(20);

/// Why NCCL cannot be used here, or `None` if the driver, NVRTC, cuBLAS and NCCL libraries
/// are all present. Call before anything else: cudarc panics on a missing library.
pub fn missing_library() -> Option<String> {
    if let Some(why) = pipewright_kernels::cuda::missing_library() {
        return Some(why.to_string());
    }
    // SAFETY: this only tries to dlopen the library; no NCCL call is made.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Some(
            "the NCCL library is not present: cudarc loads libnccl.so (or libnccl.so.13 ... .9); \
             the NCCL pip wheel ships only libnccl.so.2, so a libnccl.so link to it on \
             LD_LIBRARY_PATH may be needed"
                .into(),
        );
    }
    None
}

fn nccl_err(e: impl std::fmt::Debug) -> CommError {
    CommError::Device(format!("NCCL: {e:?}"))
}

fn device_err(e: impl std::fmt::Debug) -> CommError {
    CommError::Device(format!("{e:?}"))
}

/// A started NCCL all-reduce or reduce-scatter: the result and the event after the
/// reduction (none when the group is this rank alone). A reduce-scatter also keeps its
/// padded input alive until then, and cuts its padded shard to `len`.
pub struct NcclPending {
    tensor: CudaTensor,
    done: Option<CudaEvent>,
    input: Option<CudaTensor>,
    len: Option<usize>,
}

impl NcclPending {
    fn ready(tensor: CudaTensor) -> Self {
        NcclPending {
            tensor,
            done: None,
            input: None,
            len: None,
        }
    }
}

/// One rank's NCCL communicator. Not `Send` (NCCL's communicators are not): it lives on its
/// GPU's executor thread.
pub struct NcclComm {
    rank: usize,
    size: usize,
    backend: Arc<CudaBackend>,
    /// Host-to-device header copies and header reads, on a stream no NCCL op ever blocks.
    staging: Arc<CudaStream>,
    groups: RefCell<HashMap<(GroupKind, usize), Rc<Comm>>>,
    outgoing: RefCell<HashMap<usize, Rc<LinkEnd>>>,
    incoming: RefCell<HashMap<usize, Rc<LinkEnd>>>,
    timeout: Duration,
    aborted: RefCell<Option<String>>,
}

impl NcclComm {
    fn compute(&self) -> &Arc<CudaStream> {
        self.backend.stream()
    }

    fn check_alive(&self) -> Result<(), CommError> {
        match &*self.aborted.borrow() {
            Some(reason) => Err(CommError::Aborted(reason.clone())),
            None => Ok(()),
        }
    }

    fn link(
        &self,
        map: &RefCell<HashMap<usize, Rc<LinkEnd>>>,
        peer: usize,
        way: &str,
    ) -> Result<Rc<LinkEnd>, CommError> {
        self.check_alive()?;
        map.borrow().get(&peer).cloned().ok_or_else(|| {
            CommError::Invalid(format!(
                "no pipeline link {way} rank {peer} at rank {}",
                self.rank
            ))
        })
    }

    /// The group's communicator; `None` for a group of this rank alone without one.
    fn group_comm(&self, group: &Group) -> Result<Option<Rc<Comm>>, CommError> {
        self.check_alive()?;
        if group.position(self.rank).is_none() {
            return Err(CommError::Invalid(format!(
                "rank {} is not in group {:?} {:?}",
                self.rank, group.kind, group.ranks
            )));
        }
        match self.groups.borrow().get(&(group.kind, group.index)) {
            Some(c) => Ok(Some(Rc::clone(c))),
            None if group.size() == 1 => Ok(None),
            None => Err(CommError::Invalid(format!(
                "no NCCL communicator for group {:?} {:?}",
                group.kind, group.ranks
            ))),
        }
    }

    /// Make `stream` wait for the work queued so far on the compute stream.
    fn after_compute(&self, stream: &CudaStream) -> Result<(), CommError> {
        let ev = self.compute().record_event(None).map_err(device_err)?;
        stream.wait(&ev).map_err(device_err)
    }

    /// Wait on the host for `ev`, within the timeout.
    fn wait_event(&self, ev: &CudaEvent, what: &dyn Fn() -> String) -> Result<(), CommError> {
        let deadline = Instant::now() + self.timeout;
        while !ev.try_is_complete().map_err(device_err)? {
            self.check_alive()?;
            if Instant::now() >= deadline {
                return Err(self.timed_out(what()));
            }
            std::thread::sleep(NAP);
        }
        Ok(())
    }

    /// Wait (within the timeout) until every send this rank has started is complete, so its
    /// communicators can be dropped. Call after the rank's last step, before the drop:
    /// cudarc drops a `Comm` with `ncclCommAbort`, and a send still in flight then (the last
    /// step's last sends: the peer posts their receives, and the sender moves on, without
    /// waiting for the data) would be cut off, leaving the peer's compute stream waiting for a
    /// receive that never completes, and its next host wait hanging.
    pub fn finish(&self) -> Result<(), CommError> {
        for (peer, link) in self.outgoing.borrow().iter() {
            let mut in_flight = link.in_flight.borrow_mut();
            for (_, done) in in_flight.iter() {
                self.wait_event(done, &|| format!("the last sends to rank {peer} over NCCL"))?;
            }
            in_flight.clear();
        }
        Ok(())
    }

    fn timed_out(&self, what: String) -> CommError {
        CommError::Timeout {
            what,
            secs: self.timeout.as_secs_f64(),
        }
    }

    /// A copy of `src` on the compute stream.
    fn zeros(&self, n: usize) -> Result<CudaTensor, CommError> {
        self.backend.zeros(&[n]).map_err(device_err)
    }

    /// `t` (flat) followed by zeros up to `len` values; `t` itself when it is that long.
    fn padded(&self, t: CudaTensor, len: usize) -> Result<CudaTensor, CommError> {
        if t.numel() == len {
            return Ok(t);
        }
        let mut out = self.zeros(len)?;
        if t.numel() > 0 {
            self.backend
                .copy_to_offset(&t, &mut out, 0)
                .map_err(device_err)?;
        }
        Ok(out)
    }

    /// Values `from..from + len` of `t`, as a new flat tensor.
    fn cut(&self, t: &CudaTensor, from: usize, len: usize) -> Result<CudaTensor, CommError> {
        if len == 0 {
            return self.zeros(0);
        }
        let data = self
            .compute()
            .clone_dtod(&t.slice().slice(from..from + len))
            .map_err(device_err)?;
        CudaTensor::from_slice(&[len], data).map_err(device_err)
    }

    fn position(&self, group: &Group) -> Result<usize, CommError> {
        group.position(self.rank).ok_or_else(|| {
            CommError::Invalid(format!(
                "rank {} is not in group {:?}",
                self.rank, group.ranks
            ))
        })
    }

    fn copy(&self, src: &CudaTensor) -> Result<CudaTensor, CommError> {
        let data = self.compute().clone_dtod(src.slice()).map_err(device_err)?;
        CudaTensor::from_slice(src.shape(), data).map_err(device_err)
    }

    /// Run a collective on `comm`'s stream after the compute stream's work, wait for it on
    /// the host, and order the compute stream after it.
    fn collective(
        &self,
        comm: &Comm,
        what: &dyn Fn() -> String,
        op: impl FnOnce(&Comm) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let stream = comm.stream();
        self.after_compute(&stream)?;
        op(comm)?;
        let done = stream.record_event(None).map_err(device_err)?;
        self.wait_event(&done, what)?;
        self.compute().wait(&done).map_err(device_err)
    }

    /// Receive the header of the next message on `link` and wait for it (and for every
    /// earlier payload of the link to be posted).
    async fn next_header(
        &self,
        link: &LinkEnd,
        index: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(Tag, pipewright_kernels::DType, Vec<usize>), CommError> {
        let mut buf = self
            .staging
            .alloc_zeros::<u64>(header::HEADER)
            .map_err(device_err)?;
        let hs = link.headers.stream();
        let staged = self.staging.record_event(None).map_err(device_err)?;
        hs.wait(&staged).map_err(device_err)?;
        link.headers.recv(&mut buf, link.peer).map_err(nccl_err)?;
        let arrived = hs.record_event(None).map_err(device_err)?;
        let deadline = Instant::now() + self.timeout;
        let mut idle = 0u32;
        while !(arrived.try_is_complete().map_err(device_err)? && link.taken.get() == index) {
            self.check_alive()?;
            if Instant::now() >= deadline {
                return Err(self.timed_out(what()));
            }
            // Let the executor's other tasks run; nap once nothing else does.
            tokio::task::yield_now().await;
            idle += 1;
            if idle > 64 {
                std::thread::sleep(NAP);
            }
        }
        self.staging.wait(&arrived).map_err(device_err)?;
        let h = self.staging.clone_dtoh(&buf).map_err(device_err)?;
        header::decode(&h)
    }
}

impl Communicator for NcclComm {
    type Tensor = CudaTensor;
    type Pending = NcclPending;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(&self, dst: usize, tag: Tag, tensor: CudaTensor) -> Result<(), CommError> {
        let link = self.link(&self.outgoing, dst, "to")?;
        link.reap()?;
        // The conversion (in a bf16 run) is queued on the compute stream, which the payload
        // stream waits for below.
        let kept = self.backend.keep(tensor).map_err(device_err)?;
        let header = header::encode(tag, kept.dtype(), kept.shape())?;
        let hbuf = self.staging.clone_htod(&header).map_err(device_err)?;
        let staged = self.staging.record_event(None).map_err(device_err)?;
        let hs = link.headers.stream();
        hs.wait(&staged).map_err(device_err)?;
        link.headers.send(&hbuf, link.peer).map_err(nccl_err)?;
        link.keep(Keep::Header(hbuf), &hs)?;
        let n = kept.numel();
        if n > 0 {
            let ps = link.payloads.stream();
            self.after_compute(&ps)?;
            match &kept {
                CudaKept::F32(t) => link.payloads.send(&t.slice().slice(0..n), link.peer),
                CudaKept::Bf16 { data, .. } => link.payloads.send(&data.slice(0..n), link.peer),
            }
            .map_err(nccl_err)?;
            link.keep(Keep::Payload(kept), &ps)?;
        }
        Ok(())
    }

    async fn recv(&self, src: usize, tag: Tag) -> Result<CudaTensor, CommError> {
        let link = self.link(&self.incoming, src, "from")?;
        let index = link.posted.get();
        link.posted.set(index + 1);
        let what = || format!("{tag} from rank {src} over NCCL");
        let (got, wire, shape) = self.next_header(&link, index, &what).await?;
        if got != tag {
            return Err(CommError::Invalid(format!(
                "NCCL link from rank {src}: expected the {tag}, got the {got} \
                 (the sender's SEND order differs from this rank's RECV order)"
            )));
        }
        // On the compute stream, like every buffer of this rank.
        let mut payload = self.backend.kept_zeros(&shape, wire).map_err(device_err)?;
        let n = payload.numel();
        if n > 0 {
            let ps = link.payloads.stream();
            self.after_compute(&ps)?;
            match &mut payload {
                CudaKept::F32(t) => {
                    let mut view = t.slice_mut().slice_mut(0..n);
                    link.payloads.recv(&mut view, link.peer)
                }
                CudaKept::Bf16 { data, .. } => {
                    link.payloads.recv(&mut data.slice_mut(0..n), link.peer)
                }
            }
            .map_err(nccl_err)?;
            let done = ps.record_event(None).map_err(device_err)?;
            self.compute().wait(&done).map_err(device_err)?;
        }
        link.taken.set(index + 1);
        // Widened on the compute stream, after the payload has arrived.
        self.backend.restore_owned(payload).map_err(device_err)
    }

    fn start_all_reduce(
        &self,
        group: &Group,
        mut tensor: CudaTensor,
        op: ReduceOp,
    ) -> Result<NcclPending, CommError> {
        let n = tensor.numel();
        let comm = match self.group_comm(group)? {
            Some(c) if n > 0 => c,
            _ => return Ok(NcclPending::ready(tensor)),
        };
        let stream = comm.stream();
        self.after_compute(&stream)?;
        let op = match op {
            ReduceOp::Sum => NcclOp::Sum,
            ReduceOp::Mean => NcclOp::Avg,
        };
        let mut view = tensor.slice_mut().slice_mut(0..n);
        comm.all_reduce_in_place(&mut view, &op).map_err(nccl_err)?;
        let done = stream.record_event(None).map_err(device_err)?;
        Ok(NcclPending {
            tensor,
            done: Some(done),
            input: None,
            len: None,
        })
    }

    fn wait_all_reduce(&self, p: NcclPending) -> Result<CudaTensor, CommError> {
        if let Some(done) = &p.done {
            self.wait_event(done, &|| "an NCCL all-reduce".into())?;
            self.compute().wait(done).map_err(device_err)?;
        }
        Ok(p.tensor)
    }

    fn all_reduce(
        &self,
        group: &Group,
        tensor: &mut CudaTensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let placeholder = self.backend.zeros(&[0]).map_err(device_err)?;
        let t = std::mem::replace(tensor, placeholder);
        *tensor = self.wait_all_reduce(self.start_all_reduce(group, t, op)?)?;
        Ok(())
    }

    /// NCCL gathers equal counts: every rank's tensor must have this rank's shape.
    fn all_gather(&self, group: &Group, t: &CudaTensor) -> Result<Vec<CudaTensor>, CommError> {
        let (n, len) = (group.size(), t.numel());
        let comm = match self.group_comm(group)? {
            Some(c) if len > 0 => c,
            _ => return (0..n).map(|_| self.copy(t)).collect(),
        };
        let mut all = self.backend.zeros(&[n * len]).map_err(device_err)?;
        self.collective(&comm, &|| "an NCCL all-gather".into(), |c| {
            let mut dst = all.slice_mut().slice_mut(0..n * len);
            c.all_gather(&t.slice().slice(0..len), &mut dst)
                .map(drop)
                .map_err(nccl_err)
        })?;
        (0..n)
            .map(|i| {
                let part = all.slice().slice(i * len..(i + 1) * len);
                let data = self.compute().clone_dtod(&part).map_err(device_err)?;
                CudaTensor::from_slice(t.shape(), data).map_err(device_err)
            })
            .collect()
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        t: &CudaTensor,
        op: ReduceOp,
    ) -> Result<CudaTensor, CommError> {
        let t = self.copy(t)?;
        self.wait_reduce_scatter(self.start_reduce_scatter(group, t, op)?)
    }

    /// `ncclReduceScatter` of the flat tensor padded to `n` blocks of `ceil(numel / n)`.
    /// NCCL's summation order is its own, so shards match an NCCL all-reduce within
    /// rounding, not necessarily to the bit.
    fn start_reduce_scatter(
        &self,
        group: &Group,
        tensor: CudaTensor,
        op: ReduceOp,
    ) -> Result<NcclPending, CommError> {
        let (n, numel) = (group.size(), tensor.numel());
        let len = shard_range(numel, n, self.position(group)?).len();
        let chunk = numel.div_ceil(n);
        let comm = match self.group_comm(group)? {
            Some(c) if chunk > 0 => c,
            Some(_) => return Ok(NcclPending::ready(self.zeros(0)?)),
            None => return Ok(NcclPending::ready(tensor)),
        };
        let padded = self.padded(tensor, chunk * n)?;
        let mut out = self.zeros(chunk)?;
        let stream = comm.stream();
        self.after_compute(&stream)?;
        let op = match op {
            ReduceOp::Sum => NcclOp::Sum,
            ReduceOp::Mean => NcclOp::Avg,
        };
        let mut dst = out.slice_mut().slice_mut(0..chunk);
        comm.reduce_scatter(&padded.slice().slice(0..chunk * n), &mut dst, &op)
            .map_err(nccl_err)?;
        let done = stream.record_event(None).map_err(device_err)?;
        Ok(NcclPending {
            tensor: out,
            done: Some(done),
            input: Some(padded),
            len: Some(len),
        })
    }

    fn wait_reduce_scatter(&self, mut p: NcclPending) -> Result<CudaTensor, CommError> {
        let len = p.len.take();
        let input = p.input.take();
        let t = self.wait_all_reduce(p)?;
        drop(input); // the reduction that read it has completed
        match len {
            Some(len) if len < t.numel() => self.cut(&t, 0, len),
            _ => Ok(t),
        }
    }

    /// `ncclAllGather` of the shards padded to `ceil(numel / n)`, then cut to `numel`.
    fn all_gather_shards(
        &self,
        group: &Group,
        shard: CudaTensor,
        numel: usize,
    ) -> Result<CudaTensor, CommError> {
        let n = group.size();
        check_shard(shard.numel(), numel, n, self.position(group)?)?;
        let chunk = numel.div_ceil(n);
        let comm = match self.group_comm(group)? {
            Some(c) if chunk > 0 => c,
            _ => return Ok(shard), // alone, it is the whole; or there is nothing
        };
        let padded = self.padded(shard, chunk)?;
        let mut all = self.zeros(n * chunk)?;
        self.collective(&comm, &|| "an NCCL all-gather of shards".into(), |c| {
            let mut dst = all.slice_mut().slice_mut(0..n * chunk);
            c.all_gather(&padded.slice().slice(0..chunk), &mut dst)
                .map(drop)
                .map_err(nccl_err)
        })?;
        if n * chunk == numel {
            return Ok(all);
        }
        let mut out = self.zeros(numel)?;
        for i in 0..n {
            let r = shard_range(numel, n, i);
            if r.is_empty() {
                continue;
            }
            let src = all.slice().slice(i * chunk..i * chunk + r.len());
            let mut dst = out.slice_mut().slice_mut(r);
            self.compute()
                .memcpy_dtod(&src, &mut dst)
                .map_err(device_err)?;
        }
        Ok(out)
    }

    fn numel(&self, t: &CudaTensor) -> usize {
        t.numel()
    }

    fn barrier(&self, group: &Group) -> Result<(), CommError> {
        let Some(comm) = self.group_comm(group)? else {
            return Ok(());
        };
        let mut one = self.backend.zeros(&[1]).map_err(device_err)?;
        self.collective(&comm, &|| "an NCCL barrier".into(), |c| {
            c.all_reduce_in_place(one.slice_mut(), &NcclOp::Sum)
                .map(drop)
                .map_err(nccl_err)
        })
    }

    /// Fail this rank's pending and later operations and abort its NCCL communicators
    /// (dropping a cudarc `Comm` calls `ncclCommAbort`), which ends its kernels that wait
    /// for peers. Peers notice through their own timeouts (NCCL cannot tell them).
    fn abort(&self, reason: &str) {
        self.aborted
            .borrow_mut()
            .get_or_insert_with(|| reason.to_string());
        self.groups.borrow_mut().clear();
        self.outgoing.borrow_mut().clear();
        self.incoming.borrow_mut().clear();
    }
}
