//! The in-process transport: every rank a thread of one process.
//!
//! Point-to-point: one async channel per (destination, source, tag), so a receive matches by
//! tag whatever order messages arrive in. Collectives: ranks of a group deposit their tensors
//! in a numbered round and combine them in group order, so every rank gets bit-identical
//! results. Any rank can abort the world: waiting receives and collectives wake and fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_channel::{Receiver, Sender};
use pipewright_kernels::Tensor;

use super::{reduce_in_order, share_of, CommError, Communicator, ReduceOp, Tag};
use crate::mesh::{Group, GroupKind};

type Channel = (Sender<Tensor>, Receiver<Tensor>);

/// State shared by all ranks of one process.
pub struct LocalWorld {
    size: usize,
    timeout: Duration,
    mailboxes: Vec<Mutex<HashMap<(usize, Tag), Channel>>>,
    groups: Mutex<HashMap<(GroupKind, usize), Arc<Rounds>>>,
    aborted: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Closed on abort, which wakes every receive waiting on it.
    abort_tx: Sender<()>,
    abort_rx: Receiver<()>,
}

/// Collectives in flight on one group, by sequence number.
#[derive(Default)]
struct Rounds {
    rounds: Mutex<HashMap<u64, Round>>,
    changed: Condvar,
}

struct Round {
    parts: Vec<Option<Tensor>>,
    collected: usize,
}

impl LocalWorld {
    /// A world of `size` ranks whose waits give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> Arc<LocalWorld> {
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

    /// The communicator of one rank.
    pub fn comm(self: &Arc<Self>, rank: usize) -> LocalComm {
        LocalComm {
            world: Arc::clone(self),
            rank,
            seq: Mutex::new(HashMap::new()),
        }
    }

    /// Why the world was aborted, if it was.
    pub fn abort_reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    fn abort(&self, reason: &str) {
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

    fn channel(&self, dst: usize, src: usize, tag: Tag) -> Channel {
        let mut map = lock(&self.mailboxes[dst]);
        map.entry((src, tag))
            .or_insert_with(async_channel::unbounded)
            .clone()
    }

    fn rounds(&self, group: &Group) -> Arc<Rounds> {
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
pub struct LocalComm {
    world: Arc<LocalWorld>,
    rank: usize,
    /// Next collective sequence number per group: ranks call collectives on a group in the
    /// same order, so equal numbers meet in one round.
    seq: Mutex<HashMap<(GroupKind, usize), u64>>,
}

/// A started local all-reduce.
pub struct LocalPending {
    rounds: Arc<Rounds>,
    seq: u64,
    size: usize,
    op: ReduceOp,
}

impl LocalComm {
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

    /// Put this rank's part into the next round of `group`.
    fn deposit(&self, group: &Group, tensor: Tensor) -> Result<(Arc<Rounds>, u64), CommError> {
        let pos = self.check(group)?;
        let seq = self.next_seq(group);
        let rounds = self.world.rounds(group);
        {
            let mut map = lock(&rounds.rounds);
            let round = map.entry(seq).or_insert_with(|| Round {
                parts: vec![None; group.size()],
                collected: 0,
            });
            round.parts[pos] = Some(tensor);
        }
        rounds.changed.notify_all();
        Ok((rounds, seq))
    }

    /// Wait until every part of round `seq` is in, then apply `f` to them (in group order).
    fn collect<T>(
        &self,
        rounds: &Rounds,
        seq: u64,
        size: usize,
        f: impl FnOnce(&[Option<Tensor>]) -> T,
    ) -> Result<T, CommError> {
        let deadline = Instant::now() + self.world.timeout;
        let mut map = lock(&rounds.rounds);
        loop {
            if self.world.aborted.load(Ordering::SeqCst) {
                return Err(self.world.aborted_error());
            }
            if let Some(r) = map.get(&seq) {
                if r.parts.iter().all(Option::is_some) {
                    break;
                }
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
        let out = f(&round.parts);
        round.collected += 1;
        if round.collected == size {
            map.remove(&seq);
        }
        Ok(out)
    }
}

impl Communicator for LocalComm {
    type Pending = LocalPending;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn send(&self, dst: usize, tag: Tag, tensor: Tensor) -> Result<(), CommError> {
        if dst >= self.world.size {
            return Err(CommError::Invalid(format!(
                "send to rank {dst} of {}",
                self.world.size
            )));
        }
        if self.world.aborted.load(Ordering::SeqCst) {
            return Err(self.world.aborted_error());
        }
        let (tx, _) = self.world.channel(dst, self.rank, tag);
        tx.try_send(tensor)
            .map_err(|_| CommError::Invalid(format!("mailbox of rank {dst} closed")))
    }

    async fn recv(&self, src: usize, tag: Tag) -> Result<Tensor, CommError> {
        let (_, rx) = self.world.channel(self.rank, src, tag);
        let abort = self.world.abort_rx.clone();
        let got = tokio::select! {
            biased;
            t = rx.recv() => t.map_err(|_| CommError::Invalid("channel closed".into())),
            _ = abort.recv() => Err(self.world.aborted_error()),
        };
        if got.is_ok() {
            // One receiver per tag: the entry is done with.
            lock(&self.world.mailboxes[self.rank]).remove(&(src, tag));
        }
        got
    }

    fn start_all_reduce(
        &self,
        group: &Group,
        tensor: Tensor,
        op: ReduceOp,
    ) -> Result<LocalPending, CommError> {
        let (rounds, seq) = self.deposit(group, tensor)?;
        Ok(LocalPending {
            rounds,
            seq,
            size: group.size(),
            op,
        })
    }

    fn wait_all_reduce(&self, p: LocalPending) -> Result<Tensor, CommError> {
        self.collect(&p.rounds, p.seq, p.size, |parts| {
            reduce_in_order(parts.iter().flatten(), p.op)
        })?
    }

    fn all_gather(&self, group: &Group, tensor: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let (rounds, seq) = self.deposit(group, tensor.clone())?;
        self.collect(&rounds, seq, group.size(), |parts| {
            parts.iter().flatten().cloned().collect()
        })
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        tensor: &Tensor,
        op: ReduceOp,
    ) -> Result<Tensor, CommError> {
        let n = group.size();
        let pos = self.check(group)?;
        share_of(tensor, 0, n)?; // refuse an uneven split before anyone reduces
        let mut whole = tensor.clone();
        self.all_reduce(group, &mut whole, op)?;
        share_of(&whole, pos, n)
    }

    fn barrier(&self, group: &Group) -> Result<(), CommError> {
        let (rounds, seq) = self.deposit(group, Tensor::zeros(&[0]))?;
        self.collect(&rounds, seq, group.size(), |_| ())
    }

    fn abort(&self, reason: &str) {
        self.world.abort(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Direction;
    use crate::mesh::Mesh;

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
