//! Long native calls (`search`, `sweep`) run with the interpreter released, so other Python
//! threads go on, and stop on Ctrl-C: the work runs on a worker thread that polls a
//! [`Cancel`] flag, while the calling thread checks Python's signal handlers every [`POLL`].

use std::sync::mpsc;
use std::time::Duration;

use pipewright_schedule::Cancel;
use pyo3::prelude::*;

use crate::err;

/// How often the waiting thread runs Python's signal handlers: Ctrl-C is seen within this.
const POLL: Duration = Duration::from_millis(50);

/// Stack of the worker thread: as large as a main thread's, for the deepest simulations.
const STACK: usize = 8 << 20;

/// `work()`, run on a worker thread with the interpreter released. When a signal handler
/// raises (Ctrl-C's KeyboardInterrupt), `cancel` is set and the handler's exception is raised
/// at once: the worker, left to end on its own, stops at its next check of the flag (within
/// one candidate or one sweep row).
pub(crate) fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    cancel: &Cancel,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    py.detach(|| {
        let (done, finished) = mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("pipewright-work".into())
            .stack_size(STACK)
            .spawn(move || {
                let out = work();
                // The waiter is gone after a signal: nobody to tell.
                let _ = done.send(());
                out
            })
            .map_err(|e| err(format!("cannot start a worker thread: {e}")))?;
        // A panic drops `done` unsent: Disconnected ends the wait as Ok does.
        while let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(POLL) {
            Python::attach(|py| py.check_signals()).inspect_err(|_| cancel.cancel())?;
        }
        match worker.join() {
            Ok(out) => Ok(out),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
