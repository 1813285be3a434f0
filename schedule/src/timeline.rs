//! `Timeline`: what happened (or is predicted to happen) on each device, and when.
//!
//! The simulator writes one; the runtime records one. Charts, Chrome traces and comparisons
//! take a `Timeline` and never ask which kind it is.

use serde::{Deserialize, Serialize};

mod check;
pub use check::{same_pipeline, OtherPipeline, TimelineError, MAX_DEVICES};

use crate::action::{Action, ActionKind};

/// Where a timeline came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimelineSource {
    /// Predicted by the simulator from a cost model.
    Simulated,
    /// Recorded by the runtime during a real run.
    Measured,
}

/// What a timeline is of: enough to title a chart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineMeta {
    /// Schedule name, e.g. `interleaved-1f1b`, or `custom` for a hand-written timetable.
    pub schedule: String,
    /// Number of devices (pipeline ranks), `p`.
    pub devices: u32,
    /// Number of stages (model chunks), `S = p * v`.
    pub stages: u32,
    /// Number of microbatches, `m`.
    pub microbatches: u32,
    /// Simulated or measured.
    pub source: TimelineSource,
    /// Unit of `start` and `end`: `"units"` for abstract simulator costs, or `"us"`, `"ms"`, `"s"`.
    pub time_unit: String,
}

/// One action's interval on one device. Compute actions occupy the device's compute stream;
/// `SEND_*`/`RECV_*` events span the transfer on the comm stream of the sending or receiving device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Device (pipeline rank) the event ran on.
    pub device: u32,
    /// The action.
    pub action: Action,
    /// Start time, in the timeline's unit.
    pub start: f64,
    /// End time, in the timeline's unit; `end >= start`.
    pub end: f64,
}

impl Event {
    /// `end - start`.
    pub fn duration(&self) -> f64 {
        self.end - self.start
    }
}

/// Events of a run, per device, with start and end times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// What the timeline is of.
    pub meta: TimelineMeta,
    /// All events, compute and comm, in no particular order across devices.
    pub events: Vec<Event>,
}

impl Timeline {
    /// End of the last event (the step's makespan when the step starts at 0).
    pub fn makespan(&self) -> f64 {
        self.events.iter().map(|e| e.end).fold(0.0, f64::max)
    }

    /// Start of the first event.
    pub fn start(&self) -> f64 {
        self.events
            .iter()
            .map(|e| e.start)
            .fold(f64::INFINITY, f64::min)
            .min(self.makespan())
    }

    /// Compute events only.
    pub fn compute_events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(|e| e.action.kind.is_compute())
    }

    /// Total compute time of each device.
    pub fn busy_per_device(&self) -> Vec<f64> {
        let mut busy = vec![0.0; self.meta.devices as usize];
        for e in self.compute_events() {
            if let Some(b) = busy.get_mut(e.device as usize) {
                *b += e.duration();
            }
        }
        busy
    }

    /// Fraction of the span `[start, makespan]` each device spends without compute.
    pub fn bubble_per_device(&self) -> Vec<f64> {
        let span = self.makespan() - self.start();
        self.busy_per_device()
            .into_iter()
            .map(|b| if span > 0.0 { 1.0 - b / span } else { 0.0 })
            .collect()
    }

    /// `1 - ideal / span`, where ideal is the compute time of the busiest device.
    pub fn bubble_fraction(&self) -> f64 {
        let span = self.makespan() - self.start();
        let ideal = self.busy_per_device().into_iter().fold(0.0, f64::max);
        if span > 0.0 {
            1.0 - ideal / span
        } else {
            0.0
        }
    }

    /// Number of events of one kind.
    pub fn count(&self, kind: ActionKind) -> usize {
        self.events.iter().filter(|e| e.action.kind == kind).count()
    }
}

/// Stashed activations on one device from `time` until the next sample.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// When the amount changed.
    pub time: f64,
    /// Microbatch-stages whose activations are held (forward done, backward not yet).
    pub count: u32,
    /// Bytes those activations take.
    pub bytes: u64,
}
