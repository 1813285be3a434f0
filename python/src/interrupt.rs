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

/// `work(cancel)`, run on a worker thread with the interpreter released. When a signal
/// handler raises (Ctrl-C's KeyboardInterrupt), `cancel` is set, the work is waited for (it
/// stops at its next check of the flag) and the handler's exception is raised.
pub(crate) fn interruptible<T: Send>(
    py: Python<'_>,
    cancel: &Cancel,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    py.detach(|| {
        std::thread::scope(|s| {
            let (done, finished) = mpsc::channel::<()>();
            let worker = std::thread::Builder::new()
                .name("pipewright-work".into())
                .stack_size(STACK)
                .spawn_scoped(s, move || {
                    let out = work();
                    // The waiter may have gone (it never does before joining): nothing to tell.
                    let _ = done.send(());
                    out
                })
                .map_err(|e| err(format!("cannot start a worker thread: {e}")))?;
            let mut signal = Ok(());
            // A panic drops `done` unsent: Disconnected ends the wait as Ok does.
            while let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(POLL) {
                signal = Python::attach(|py| py.check_signals());
                if signal.is_err() {
                    cancel.cancel();
                    break;
                }
            }
            let out = match worker.join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            signal.map(|()| out)
        })
    })
}
