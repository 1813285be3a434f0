//! Telling a dead peer from a slow one: where each rank's process lives, whether a process of
//! this host still runs, and mpirun's SIGTERM caught as a flag.

/// Where a rank's process lives, to tell a dead peer from a slow one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    pub(super) host: u64,
    pub(super) pid: u64,
}

/// A stable identity of this host (a hash of its name), to know which peers can be checked.
pub(super) fn host_id() -> u64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    // FNV-1a: stable across processes and builds, unlike std's randomly seeded hasher.
    name.trim().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Whether a process of this host still runs (a zombie, killed but not yet reaped, does not).
pub(super) fn process_alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        // Without /proc (not Linux) nothing can be said; assume alive and rely on timeouts.
        Err(_) => !std::path::Path::new("/proc/self/stat").exists(),
    }
}

/// SIGTERM as an error instead of a sudden death. When a rank dies, mpirun ends the job: it
/// sends the other ranks SIGTERM and, a second or so later, SIGKILL. Caught, SIGTERM only sets
/// a flag; the next wait turns it into an error naming the lost peer, so every rank has
/// reported before mpirun's SIGKILL.
pub(super) mod sigterm {
    use std::sync::atomic::{AtomicBool, Ordering};

    static RECEIVED: AtomicBool = AtomicBool::new(false);

    #[cfg(target_os = "linux")]
    extern "C" fn on_sigterm(_: libc::c_int) {
        // Async-signal-safe: one atomic store.
        RECEIVED.store(true, Ordering::SeqCst);
    }

    /// Install the handler (once per process is enough; again is harmless).
    pub(in crate::mpi) fn catch() {
        #[cfg(target_os = "linux")]
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                libc::SIGTERM,
                on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }

    pub(in crate::mpi) fn received() -> bool {
        RECEIVED.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        assert!(process_alive(u64::from(std::process::id())));
        assert!(!process_alive(u64::from(u32::MAX)));
    }
}
