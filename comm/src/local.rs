//! The in-process transport: every rank a thread of one process.
//!
//! Point-to-point: one async channel per (destination, source, tag), so a receive matches by
//! tag whatever order messages arrive in. Collectives: ranks of a group deposit their tensors
//! in a numbered round and combine them in group order, so every rank gets bit-identical
//! results. Any rank can abort the world: waiting receives and collectives wake and fail.
//!
//! This control plane is generic over the payload: [`LocalOps`] says how one rank hands a
//! tensor over, takes one in and combines a round. [`HostOps`] moves host tensors (the
//! default, [`LocalComm`]); the CUDA-local transport (`comm::cuda_local`, feature `cuda`)
//! plugs in device copies ordered by CUDA events, and so shares every line of the waiting,
//! timeout and abort logic that the CPU tests exercise.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use async_channel::{Receiver, Sender};
use pipewright_kernels::Tensor;

use super::{CommError, Communicator, ReduceOp, Tag};
use crate::mesh::{Group, GroupKind};

mod ops;

pub use ops::{HostOps, LocalOps};

type Channel<M> = (Sender<M>, Receiver<M>);
/// One rank's mailboxes: a channel per (source, tag).
type Mailbox<M> = Mutex<HashMap<(usize, Tag), Channel<M>>>;
/// The collectives in flight, per group.
type GroupRounds<M> = Mutex<HashMap<(GroupKind, usize), Arc<Rounds<M>>>>;

/// State shared by all ranks of one process; `M` is what travels ([`LocalOps::Message`]).
pub struct LocalWorld<M = Tensor> {
    size: usize,
    timeout: Duration,
    mailboxes: Vec<Mailbox<M>>,
    groups: GroupRounds<M>,
    aborted: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Closed on abort, which wakes every receive waiting on it.
    abort_tx: Sender<()>,
    abort_rx: Receiver<()>,
}

/// Collectives in flight on one group, by sequence number.
struct Rounds<M> {
    rounds: Mutex<HashMap<u64, Round<M>>>,
    changed: Condvar,
}

impl<M> Default for Rounds<M> {
    fn default() -> Self {
        Rounds {
            rounds: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        }
    }
}

/// One collective: a part per rank (none for a barrier), how many arrived and how many
/// ranks have taken their result.
struct Round<M> {
    parts: Vec<Option<M>>,
    arrived: usize,
    collected: usize,
}

impl LocalWorld<Tensor> {
    /// A world of `size` ranks moving host tensors, whose waits give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> Arc<LocalWorld> {
        LocalWorld::with_payload(size, timeout)
    }

    /// The host communicator of one rank.
    pub fn comm(self: &Arc<Self>, rank: usize) -> LocalComm {
        self.comm_with(rank, HostOps)
    }
}

impl<M> LocalWorld<M> {
    /// A world of `size` ranks exchanging `M`s, whose waits give up after `timeout`.
    pub fn with_payload(size: usize, timeout: Duration) -> Arc<LocalWorld<M>> {
        let (abort_tx, abort_rx) = async_channel::bounded(1);
        Arc::new(LocalWorld {
            size,
            timeout,
            mailboxes: (0..size).map(|_| Mutex::new(HashMap::new())).collect(),
            groups: Mutex::new(HashMap::new()),
            aborted: AtomicBool::new(false),
            reason: Mutex::new(None),
            abort_tx,
            abort_rx,
        })
    }

    /// The communicator of one rank, moving data with `ops` (built on that rank's thread
    /// when it holds a GPU stream).
    pub fn comm_with<K: LocalOps<Message = M>>(
        self: &Arc<Self>,
        rank: usize,
        ops: K,
    ) -> LocalComm<K> {
        LocalComm {
            world: Arc::clone(self),
            rank,
            seq: Mutex::new(HashMap::new()),
            ops,
        }
    }

    /// Why the world was aborted, if it was.
    pub fn abort_reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    /// Stop every rank: waiting receives and collectives wake and fail with `reason`.
    pub fn abort(&self, reason: &str) {
        let mut slot = lock(&self.reason);
        if slot.is_none() {
            *slot = Some(reason.to_string());
        }
        drop(slot);
        self.aborted.store(true, Ordering::SeqCst);
        self.abort_tx.close();
        for g in lock(&self.groups).values() {
            let _guard = lock(&g.rounds);
            g.changed.notify_all();
        }
    }

    fn aborted_error(&self) -> CommError {
        CommError::Aborted(self.abort_reason().unwrap_or_else(|| "unknown".into()))
    }

    fn channel(&self, dst: usize, src: usize, tag: Tag) -> Channel<M> {
        let mut map = lock(&self.mailboxes[dst]);
        map.entry((src, tag))
            .or_insert_with(async_channel::unbounded)
            .clone()
    }

    fn rounds(&self, group: &Group) -> Arc<Rounds<M>> {
        Arc::clone(
            lock(&self.groups)
                .entry((group.kind, group.index))
                .or_default(),
        )
    }
}

/// A poisoned lock means another rank panicked while holding it; the data (maps of
/// channels and rounds) stays consistent, and the panic is reported through abort.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One rank's handle on a [`LocalWorld`]. Not `Sync` by intent: one per device thread.
pub struct LocalComm<K: LocalOps = HostOps> {
    world: Arc<LocalWorld<K::Message>>,
    rank: usize,
    /// Next collective sequence number per group: ranks call collectives on a group in the
    /// same order, so equal numbers meet in one round.
    seq: Mutex<HashMap<(GroupKind, usize), u64>>,
    ops: K,
}

/// A started local all-reduce or reduce-scatter.
pub struct LocalPending<M = Tensor> {
    rounds: Arc<Rounds<M>>,
    seq: u64,
    size: usize,
    op: ReduceOp,
    /// For a reduce-scatter: this rank's position in the group (it keeps that shard).
    scatter: Option<usize>,
}

impl<K: LocalOps> LocalComm<K> {
    /// How this rank moves data.
    pub fn ops(&self) -> &K {
        &self.ops
    }

    fn check(&self, group: &Group) -> Result<usize, CommError> {
        if self.world.aborted.load(Ordering::SeqCst) {
            return Err(self.world.aborted_error());
        }
        group.position(self.rank).ok_or_else(|| {
            CommError::Invalid(format!(
                "rank {} is not in group {:?} {:?}",
                self.rank, group.kind, group.ranks
            ))
        })
    }

    fn next_seq(&self, group: &Group) -> u64 {
        let mut seq = lock(&self.seq);
        let n = seq.entry((group.kind, group.index)).or_insert(0);
        *n += 1;
        *n
    }

    /// Put this rank's part (none for a barrier) into the next round of `group`.
    #[allow(clippy::type_complexity)]
    fn deposit(
        &self,
        group: &Group,
        part: Option<K::Message>,
    ) -> Result<(Arc<Rounds<K::Message>>, u64), CommError> {
        let pos = self.check(group)?;
        let seq = self.next_seq(group);
        let rounds = self.world.rounds(group);
        {
            let mut map = lock(&rounds.rounds);
            let round = map.entry(seq).or_insert_with(|| Round {
                parts: (0..group.size()).map(|_| None).collect(),
                arrived: 0,
                collected: 0,
            });
            round.parts[pos] = part;
            round.arrived += 1;
        }
        rounds.changed.notify_all();
        Ok((rounds, seq))
    }

    /// Wait until every rank of round `seq` is in, then apply `f` to the parts (in group
    /// order). The parts stay alive until the last rank has applied its `f`.
    fn collect<T>(
        &self,
        rounds: &Rounds<K::Message>,
        seq: u64,
        size: usize,
        f: impl FnOnce(&[&K::Message]) -> T,
    ) -> Result<T, CommError> {
        let deadline = Instant::now() + self.world.timeout;
        let mut map = lock(&rounds.rounds);
        loop {
            if self.world.aborted.load(Ordering::SeqCst) {
                return Err(self.world.aborted_error());
            }
            if map.get(&seq).is_some_and(|r| r.arrived == size) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                let secs = self.world.timeout.as_secs_f64();
                return Err(CommError::Timeout {
                    what: format!("collective #{seq} of a group of {size}"),
                    secs,
                });
            }
            map = rounds
                .changed
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let round = map
            .get_mut(&seq)
            .ok_or_else(|| CommError::Invalid("round vanished".into()))?;
        let parts: Vec<&K::Message> = round.parts.iter().flatten().collect();
        let out = f(&parts);
        round.collected += 1;
        if round.collected == size {
            map.remove(&seq);
        }
        Ok(out)
    }
}

impl<K: LocalOps> Communicator for LocalComm<K> {
    type Tensor = K::Tensor;
    type Pending = LocalPending<K::Message>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn send(&self, dst: usize, tag: Tag, tensor: K::Tensor) -> Result<(), CommError> {
        if dst >= self.world.size {
            return Err(CommError::Invalid(format!(
                "send to rank {dst} of {}",
                self.world.size
            )));
        }
        if self.world.aborted.load(Ordering::SeqCst) {
            return Err(self.world.aborted_error());
        }
        let message = self.ops.hand_off(tensor)?;
        let (tx, _) = self.world.channel(dst, self.rank, tag);
        tx.try_send(message)
            .map_err(|_| CommError::Invalid(format!("mailbox of rank {dst} closed")))
    }

    async fn recv(&self, src: usize, tag: Tag) -> Result<K::Tensor, CommError> {
        let (_, rx) = self.world.channel(self.rank, src, tag);
        let abort = self.world.abort_rx.clone();
        let got = match first_of(rx.recv(), abort.recv()).await {
            Either::Left(t) => t.map_err(|_| CommError::Invalid("channel closed".into())),
            Either::Right(_) => Err(self.world.aborted_error()),
        };
        if got.is_ok() {
            // One receiver per tag: the entry is done with.
            lock(&self.world.mailboxes[self.rank]).remove(&(src, tag));
        }
        self.ops.incoming(got?)
    }

    fn start_all_reduce(
        &self,
        group: &Group,
        tensor: K::Tensor,
        op: ReduceOp,
    ) -> Result<Self::Pending, CommError> {
        let (rounds, seq) = self.deposit(group, Some(self.ops.outgoing(tensor)?))?;
        Ok(LocalPending {
            rounds,
            seq,
            size: group.size(),
            op,
            scatter: None,
        })
    }

    /// Waits for either collective: both sum the whole round in group order, so a
    /// reduce-scatter's shard holds exactly the bits of the all-reduce's same values.
    fn wait_all_reduce(&self, p: Self::Pending) -> Result<K::Tensor, CommError> {
        let whole = self.collect(&p.rounds, p.seq, p.size, |parts| {
            self.ops.reduce(parts, p.op)
        })??;
        match p.scatter {
            Some(pos) => self.ops.share(&whole, pos, p.size),
            None => Ok(whole),
        }
    }

    fn start_reduce_scatter(
        &self,
        group: &Group,
        tensor: K::Tensor,
        op: ReduceOp,
    ) -> Result<Self::Pending, CommError> {
        let pos = self.check(group)?;
        let mut p = self.start_all_reduce(group, tensor, op)?;
        p.scatter = Some(pos);
        Ok(p)
    }

    fn wait_reduce_scatter(&self, p: Self::Pending) -> Result<K::Tensor, CommError> {
        self.wait_all_reduce(p)
    }

    fn all_gather_shards(
        &self,
        group: &Group,
        shard: K::Tensor,
        numel: usize,
    ) -> Result<K::Tensor, CommError> {
        let (rounds, seq) = self.deposit(group, Some(self.ops.outgoing(shard)?))?;
        self.collect(&rounds, seq, group.size(), |parts| {
            self.ops.concat(parts, numel)
        })?
    }

    fn numel(&self, t: &K::Tensor) -> usize {
        self.ops.numel(t)
    }

    fn all_reduce(
        &self,
        group: &Group,
        tensor: &mut K::Tensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let t = std::mem::replace(tensor, self.ops.placeholder()?);
        *tensor = self.wait_all_reduce(self.start_all_reduce(group, t, op)?)?;
        Ok(())
    }

    fn all_gather(&self, group: &Group, tensor: &K::Tensor) -> Result<Vec<K::Tensor>, CommError> {
        let (rounds, seq) = self.deposit(group, Some(self.ops.duplicate(tensor)?))?;
        self.collect(&rounds, seq, group.size(), |parts| self.ops.gather(parts))?
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        tensor: &K::Tensor,
        op: ReduceOp,
    ) -> Result<K::Tensor, CommError> {
        let pos = self.check(group)?;
        let (rounds, seq) = self.deposit(group, Some(self.ops.duplicate(tensor)?))?;
        self.wait_reduce_scatter(LocalPending {
            rounds,
            seq,
            size: group.size(),
            op,
            scatter: Some(pos),
        })
    }

    fn barrier(&self, group: &Group) -> Result<(), CommError> {
        let (rounds, seq) = self.deposit(group, None)?;
        self.collect(&rounds, seq, group.size(), |_| ())
    }

    fn abort(&self, reason: &str) {
        self.world.abort(reason);
    }
}

/// Which of two futures finished first.
enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Await whichever of `a` and `b` finishes first, `a` when both are ready (tokio's
/// `select! { biased; .. }`, without its proc macro in every user's build).
async fn first_of<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let (mut a, mut b) = (pin!(a), pin!(b));
    poll_fn(|cx| {
        if let Poll::Ready(x) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(x));
        }
        b.as_mut().poll(cx).map(Either::Right)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::Mesh;
    use crate::Direction;

    fn tag(mb: u32) -> Tag {
        Tag {
            step: 0,
            dir: Direction::Forward,
            stage: 0,
            microbatch: mb,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn first_of_prefers_the_first_when_both_are_ready() {
        let both = rt().block_on(first_of(async { 1 }, async { 2 }));
        assert!(matches!(both, Either::Left(1)));
        let second = rt().block_on(first_of(std::future::pending::<u8>(), async { 2 }));
        assert!(matches!(second, Either::Right(2)));
    }

    #[test]
    fn receives_match_by_tag_in_any_order() {
        let world = LocalWorld::new(2, Duration::from_secs(5));
        let (a, b) = (world.comm(0), world.comm(1));
        a.send(1, tag(1), Tensor::new(&[1], vec![1.0]).unwrap())
            .unwrap();
        a.send(1, tag(0), Tensor::new(&[1], vec![0.0]).unwrap())
            .unwrap();
        let r = rt();
        assert_eq!(r.block_on(b.recv(0, tag(0))).unwrap().data(), [0.0]);
        assert_eq!(r.block_on(b.recv(0, tag(1))).unwrap().data(), [1.0]);
    }

    #[test]
    fn collectives_agree_across_threads() {
        let mesh = Mesh::new(1, 4, 1).unwrap();
        let world = LocalWorld::new(4, Duration::from_secs(5));
        let results: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..4)
            .map(|r| {
                let c = world.comm(r);
                let g = mesh.group(GroupKind::Tp, r).unwrap();
                std::thread::spawn(move || {
                    let mut t = Tensor::new(&[2], vec![r as f32, 1.0]).unwrap();
                    c.all_reduce(&g, &mut t, ReduceOp::Sum).unwrap();
                    let gathered = c
                        .all_gather(&g, &Tensor::new(&[1], vec![r as f32]).unwrap())
                        .unwrap();
                    let rs = c
                        .reduce_scatter(
                            &g,
                            &Tensor::new(&[4], vec![1.0; 4]).unwrap(),
                            ReduceOp::Mean,
                        )
                        .unwrap();
                    c.barrier(&g).unwrap();
                    (
                        t.into_data(),
                        gathered.iter().map(|t| t.data()[0]).collect::<Vec<_>>(),
                        rs.into_data(),
                    )
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        for (sum, gathered, rs) in results {
            assert_eq!(sum, [6.0, 4.0]);
            assert_eq!(gathered, [0.0, 1.0, 2.0, 3.0]);
            assert_eq!(rs, [1.0]);
        }
    }

    #[test]
    fn all_to_all_hands_each_rank_its_messages_in_group_order() {
        let mesh = Mesh::new(1, 1, 3).unwrap().with_ep(3).unwrap();
        let world = LocalWorld::new(3, Duration::from_secs(5));
        let got: Vec<Vec<Vec<f32>>> = (0..3)
            .map(|r| {
                let c = world.comm(r);
                let g = mesh.group(GroupKind::Ep, r).unwrap();
                std::thread::spawn(move || {
                    // Rank r sends d + 1 values of 10 r + d to rank d.
                    let send = (0..3)
                        .map(|d| Tensor::new(&[d + 1], vec![(10 * r + d) as f32; d + 1]).unwrap())
                        .collect();
                    let got = c.all_to_all(&g, send).unwrap();
                    got.into_iter().map(Tensor::into_data).collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        for (d, msgs) in got.iter().enumerate() {
            for (src, m) in msgs.iter().enumerate() {
                assert_eq!(m, &vec![(10 * src + d) as f32; d + 1], "{src} -> {d}");
            }
        }
    }

    #[test]
    fn abort_wakes_a_waiting_receive_and_a_collective() {
        let world = LocalWorld::new(2, Duration::from_secs(30));
        let c = world.comm(1);
        let w = Arc::clone(&world);
        let waiter = std::thread::spawn(move || {
            let r = rt().block_on(c.recv(0, tag(0)));
            let g = Group {
                kind: GroupKind::World,
                index: 0,
                ranks: vec![0, 1],
            };
            (r, c.barrier(&g))
        });
        std::thread::sleep(Duration::from_millis(50));
        w.comm(0).abort("device 0 failed");
        let (r, b) = waiter.join().unwrap();
        assert_eq!(r.unwrap_err(), CommError::Aborted("device 0 failed".into()));
        assert!(matches!(b, Err(CommError::Aborted(_))));
    }

    #[test]
    fn a_collective_alone_times_out() {
        let world = LocalWorld::new(2, Duration::from_millis(50));
        let g = Group {
            kind: GroupKind::World,
            index: 0,
            ranks: vec![0, 1],
        };
        let e = world.comm(0).barrier(&g).unwrap_err();
        assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    }
}
