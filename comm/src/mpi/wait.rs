//! How an MPI rank waits: between looks at what it waits for it sweeps (takes arrived
//! messages into the mailbox, finishes sends, watches for abort notices, SIGTERM and lost
//! peers on this host) and lets the core go, spinning briefly after progress, then napping.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use mpi::raw::AsRaw;

use super::peers::{process_alive, sigterm};
use super::raw::{self, Flight, Matched};
use super::{
    ffi_any_source, MpiComm, ABORT_TAG, LIVENESS_EVERY, NAP, NOTICE_GRACE, SPIN, SWEEP_EVERY,
};
use crate::CommError;

impl MpiComm {
    /// Finish what can be finished; true when no send is left in flight.
    pub(super) fn reap_sends(&self) -> Result<bool, CommError> {
        let mut sends = self.sends.borrow_mut();
        let mut err = None;
        sends.retain_mut(|f| match f.finished() {
            Ok(done) => !done,
            Err(e) => {
                err = Some(e);
                true
            }
        });
        err.map_or(Ok(sends.is_empty()), Err)
    }

    pub(super) fn timeout_error(&self, what: String) -> CommError {
        CommError::Timeout {
            what,
            secs: self.timeout.as_secs_f64(),
        }
    }

    /// An abort notice, from this rank or another, as an error.
    pub(super) fn check_abort(&self) -> Result<(), CommError> {
        if let Some(r) = self.aborted.borrow().as_ref() {
            return Err(CommError::Aborted(r.clone()));
        }
        let Some(m) = raw::improbe(self.ctl.as_raw(), ffi_any_source(), ABORT_TAG)? else {
            return Ok(());
        };
        // A notice is small and has arrived whole: its receive finishes at once.
        let mut f = raw::imrecv::<u8>(m)?;
        while !f.test()? {
            std::thread::yield_now();
        }
        let bytes = f.into_bufs()?.into_vec();
        let reason = String::from_utf8_lossy(&bytes).into_owned();
        *self.aborted.borrow_mut() = Some(reason.clone());
        Err(CommError::Aborted(reason))
    }

    /// What a waiting rank does between looks at what it waits for, at most once per
    /// [`SWEEP_EVERY`] however many receives wait: take arrived messages into the mailbox,
    /// finish sends, look for abort notices and SIGTERM, now and then check that the peers on
    /// this host are alive, and let the core go. A device posts all its receives of a step at
    /// once; when each did this on every poll, one round of polls took tens of microseconds.
    pub(super) fn sweep(&self) -> Result<(), CommError> {
        let now = Instant::now();
        if now.duration_since(self.last_sweep.get()) < SWEEP_EVERY {
            return Ok(());
        }
        self.last_sweep.set(now);
        self.drain()?;
        self.check_abort()?;
        if sigterm::received() {
            return Err(self.after_sigterm());
        }
        self.reap_sends()?;
        if now.duration_since(self.last_liveness.get()) >= LIVENESS_EVERY {
            self.last_liveness.set(now);
            for r in 0..self.size {
                self.check_alive(r)?;
            }
        }
        self.idle();
        Ok(())
    }

    /// Match every point-to-point message that has arrived; only this rank can receive a
    /// matched message, so it waits in the mailbox until its receive asks for it.
    pub(super) fn drain(&self) -> Result<(), CommError> {
        // SAFETY: reads a constant exported by rsmpi's C shim.
        let any_tag = unsafe { mpi::ffi::RSMPI_ANY_TAG };
        while let Some(m) = raw::improbe(self.p2p.as_raw(), ffi_any_source(), any_tag)? {
            self.progressed();
            let key = (m.src as usize, m.tag);
            // In arrival order: MPI keeps messages of one sender and tag in order.
            self.mailbox
                .borrow_mut()
                .entry(key)
                .or_default()
                .push_back(m);
        }
        Ok(())
    }

    pub(super) fn take(&self, src: usize, tag: c_int) -> Option<Matched> {
        let mut mailbox = self.mailbox.borrow_mut();
        let queue = mailbox.get_mut(&(src, tag))?;
        let m = queue.pop_front();
        if queue.is_empty() {
            mailbox.remove(&(src, tag));
        }
        m
    }

    /// mpirun sends SIGTERM to every rank when one dies (or the job is cancelled): name the
    /// dead rank if one on this host is gone.
    pub(super) fn after_sigterm(&self) -> CommError {
        (0..self.size)
            .find_map(|r| self.check_alive(r).err())
            .unwrap_or_else(|| {
                CommError::Aborted("stopped by the launcher (SIGTERM): the job was ended".into())
            })
    }

    /// The pid of `rank`'s process if it is on this host and gone. A remote process cannot be
    /// looked at; it has the timeout.
    pub(super) fn gone(&self, rank: usize) -> Option<u64> {
        let p = self.peers.get(rank)?;
        (p.host == self.host && rank != self.rank && !process_alive(p.pid)).then_some(p.pid)
    }

    pub(super) fn check_alive(&self, rank: usize) -> Result<(), CommError> {
        if let Some(pid) = self.gone(rank) {
            // A rank that failed sends its notice before it exits, so a notice may be waiting
            // that names the cause better than the exit does. On a loaded host it can trail
            // the exit a little: look for it for a moment before blaming the exit (a rank
            // that failed because a third one died would otherwise be named as the cause).
            let deadline = Instant::now() + NOTICE_GRACE;
            loop {
                self.check_abort()?;
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err(CommError::PeerLost {
                rank,
                detail: format!("its process (pid {pid}) on this host has exited"),
            });
        }
        Ok(())
    }

    /// Let the thread go between polls: spin briefly after progress, then nap.
    pub(super) fn idle(&self) {
        let now = Instant::now();
        let quiet = now.duration_since(self.last_progress.get()) > SPIN;
        if quiet && now.duration_since(self.last_nap.get()) > NAP {
            // Naps must be short: Linux would stretch them by its 50 us timer slack.
            crate::timer::precise_sleeps();
            std::thread::sleep(NAP);
            self.last_nap.set(Instant::now());
        } else {
            std::thread::yield_now();
        }
    }

    pub(super) fn progressed(&self) {
        self.last_progress.set(Instant::now());
    }

    /// Wait for a flight from synchronous code (collectives); `what` names it in a timeout.
    pub(super) fn wait_sync<B>(
        &self,
        mut f: Flight<B>,
        what: &dyn Fn() -> String,
    ) -> Result<B, CommError> {
        let deadline = Instant::now() + self.timeout;
        while !f.test()? {
            self.sweep()?;
            if Instant::now() >= deadline {
                return Err(self.timeout_error(what()));
            }
        }
        self.progressed();
        f.into_bufs()
    }

    pub(super) fn wait_collective<B>(&self, f: Flight<B>, ranks: &[usize]) -> Result<B, CommError> {
        self.wait_sync(f, &|| format!("a collective with ranks {ranks:?}"))
    }

    /// Wait for a flight from async code (receives): yield to other tasks between polls.
    pub(super) async fn wait_async<B>(&self, mut f: Flight<B>) -> Result<B, CommError> {
        while !f.test()? {
            self.sweep()?;
            tokio::task::yield_now().await;
        }
        self.progressed();
        f.into_bufs()
    }

    /// Wait until the message with `tag` from `src` has arrived and is matched.
    pub(super) async fn matched(&self, src: usize, tag: c_int) -> Result<Matched, CommError> {
        loop {
            if let Some(m) = self.take(src, tag) {
                return Ok(m);
            }
            self.sweep()?;
            tokio::task::yield_now().await;
        }
    }
}
