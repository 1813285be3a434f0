//! Signs of life for long work: `train`'s log line every N steps when its output is not a
//! terminal (Megatron's log interval), and the note that a run has more device threads than
//! cores (its measured times then include waiting for a core).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use serde_json::{json, Value};

/// Prints one line every `interval` steps (or every [`LOG_SECONDS`], whichever comes first)
/// to stdout when stdout is not a terminal: a piped or redirected run shows its progress
/// instead of nothing until it ends. On a terminal the progress bar does this.
pub struct StepLog {
    interval: u64,
    on: bool,
    last: Instant,
    total: u64,
}

/// Longest gap between two log lines, whatever the interval.
pub const LOG_SECONDS: f64 = 10.0;

impl StepLog {
    /// A log of `total` steps, one line every `interval` steps; `0` turns it off.
    pub fn new(interval: u64, total: u64) -> Self {
        Self::with(
            interval,
            total,
            interval > 0 && !std::io::stdout().is_terminal(),
        )
    }

    fn with(interval: u64, total: u64, on: bool) -> Self {
        StepLog {
            interval,
            on,
            last: Instant::now(),
            total,
        }
    }

    /// The line for step `step` (0-based) if one is due.
    pub fn line(
        &mut self,
        step: u64,
        loss: f32,
        tokens_per_s: f64,
        seconds: f64,
    ) -> Option<String> {
        let done = step + 1;
        let due = done % self.interval.max(1) == 0
            || done == self.total
            || self.last.elapsed().as_secs_f64() >= LOG_SECONDS;
        if !self.on || !due {
            return None;
        }
        self.last = Instant::now();
        Some(format!(
            "step {done}/{}: loss {loss:.4}, {tokens_per_s:.0} tokens/s, step time {:.1} ms",
            self.total,
            seconds * 1e3
        ))
    }
}

/// A spinner on stderr saying what a command is doing, drawn only when stderr is a terminal
/// (`finish_and_clear` it when done).
pub fn working(what: impl Into<String>) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(what.into());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Device threads of this process against its cores: `Some(note)` when there are more
/// threads than cores.
pub fn oversubscribed(threads: usize) -> Option<String> {
    let cores = cores();
    (threads > cores).then(|| {
        format!(
            "note: {threads} device threads on {cores} cores (oversubscribed): measured times include waiting for a core, so they overstate the runtime's own"
        )
    })
}

/// The cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The JSON fields saying so: `device_threads`, `cores`, `oversubscribed`.
pub fn oversubscription_json(threads: usize) -> Value {
    json!({"device_threads": threads, "cores": cores(), "oversubscribed": threads > cores()})
}

/// Says on stderr that the run is oversubscribed, once.
pub fn warn_oversubscribed(threads: usize) {
    if let Some(note) = oversubscribed(threads) {
        super::console::note(&note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_every_interval_and_at_the_end() {
        let mut log = StepLog::with(3, 7, true);
        let due: Vec<u64> = (0..7)
            .filter(|&s| log.line(s, 1.0, 10.0, 0.01).is_some())
            .collect();
        assert_eq!(due, vec![2, 5, 6]);
        let mut off = StepLog::with(3, 7, false);
        assert!((0..7).all(|s| off.line(s, 1.0, 10.0, 0.01).is_none()));
    }

    #[test]
    fn more_threads_than_cores_is_oversubscribed() {
        assert!(oversubscribed(cores() + 1).is_some());
        assert!(oversubscribed(cores()).is_none());
    }
}
