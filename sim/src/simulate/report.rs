//! The figures of a step: makespan, bubbles, stashed activations over time.

use serde::{Deserialize, Serialize};

use super::CostModel;
use pipewright_schedule::action::ActionKind;
use pipewright_schedule::stash::{Change, Form, StashWalk};
use pipewright_schedule::timeline::{MemorySample, Timeline};

/// Figures of one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// Device index.
    pub device: u32,
    /// Time in compute actions (with the communication inside them, [`Self::comm`]).
    pub busy: f64,
    /// `1 - busy / makespan`.
    pub bubble_fraction: f64,
    /// Most microbatch-stages with stashed activations at once.
    pub peak_activations: u32,
    /// Most stashed activation bytes at once.
    pub peak_activation_bytes: u64,
    /// Stashed activations over time (a step function).
    pub memory: Vec<MemorySample>,
    /// Communication inside the device's actions (the costs' `f_comm`, `b_comm`: the
    /// all-to-all), hidden or not; part of `busy`. Absent (0) for dense costs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm: f64,
    /// Of `comm`, what F&B overlaps hid behind the other microbatch's computation.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_hidden: f64,
    /// `comm_hidden / comm` (0 with no communication).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_hidden_share: f64,
}

/// Figures of a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Time from the first action's start to the last action's end.
    pub makespan: f64,
    /// Compute time of the busiest device: the makespan with no bubble.
    pub ideal: f64,
    /// `1 - ideal / makespan`.
    pub bubble_fraction: f64,
    /// Unit of the times.
    pub time_unit: String,
    /// Per device.
    pub devices: Vec<DeviceReport>,
    /// Communication inside actions over all devices (see [`DeviceReport::comm`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm: f64,
    /// Of `comm`, what F&B overlaps hid, over all devices.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_hidden: f64,
    /// `comm_hidden / comm` over all devices (0 with no communication).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_hidden_share: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Report {
    /// Summarise a timeline; activation sizes come from `costs`.
    ///
    /// A stage-microbatch holds its activations from the start of its F to the end of its
    /// backward: the end of B, or of W when the backward is split (W still needs them). With
    /// a split, the end of I frees all but the stage's `w_memory` fraction, which W frees
    /// (by default W holds all of them). Counts follow the microbatch-stage until its W.
    /// Peaks follow the order of a device's actions, so zero-length actions (zero costs)
    /// peak exactly as short ones do. Bubble fractions over a zero makespan are undefined:
    /// NaN here, `null` in JSON.
    pub fn new(timeline: &Timeline, costs: &CostModel) -> Report {
        let makespan = timeline.makespan() - timeline.start();
        let busy = timeline.busy_per_device();
        let ideal = busy.iter().copied().fold(0.0, f64::max);
        let tracks = memory_tracks(timeline, costs);
        let comms = comm_per_device(timeline, costs, busy.len());
        let devices: Vec<DeviceReport> = busy
            .iter()
            .zip(tracks)
            .zip(comms)
            .enumerate()
            .map(|(d, ((&busy, track), (comm, hidden)))| DeviceReport {
                device: d as u32,
                busy,
                bubble_fraction: fraction_idle(busy, makespan),
                peak_activations: track.peak_count,
                peak_activation_bytes: track.peak_bytes,
                memory: track.samples,
                comm,
                comm_hidden: hidden,
                comm_hidden_share: share(hidden, comm),
            })
            .collect();
        let comm: f64 = devices.iter().map(|d| d.comm).sum();
        let comm_hidden: f64 = devices.iter().map(|d| d.comm_hidden).sum();
        Report {
            makespan,
            ideal,
            bubble_fraction: fraction_idle(ideal, makespan),
            time_unit: timeline.meta.time_unit.clone(),
            devices,
            comm,
            comm_hidden,
            comm_hidden_share: share(comm_hidden, comm),
        }
    }

    /// Largest peak of stashed activation bytes over devices.
    pub fn peak_activation_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.peak_activation_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Largest peak count of stashed microbatch-stages over devices.
    pub fn peak_activations(&self) -> u32 {
        self.devices
            .iter()
            .map(|d| d.peak_activations)
            .max()
            .unwrap_or(0)
    }
}

/// Per device, the communication inside its compute actions and how much of it F&B
/// overlaps hid (see [`CostModel::comm_hidden`]). Stages the costs lack count nothing.
fn comm_per_device(timeline: &Timeline, costs: &CostModel, n: usize) -> Vec<(f64, f64)> {
    let mut per = vec![(0.0, 0.0); n];
    let known = |a: pipewright_schedule::action::Action| {
        a.parts().all(|p| (p.stage as usize) < costs.stages.len())
    };
    for e in timeline.compute_events().filter(|e| known(e.action)) {
        if let Some((comm, hidden)) = per.get_mut(e.device as usize) {
            *comm += costs.comm(e.action);
            *hidden += costs.comm_hidden(e.action);
        }
    }
    per
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

fn fraction_idle(busy: f64, span: f64) -> f64 {
    if span > 0.0 {
        (1.0 - busy / span).max(0.0)
    } else {
        f64::NAN
    }
}

/// One device's stashed activations: the step function and its peaks.
pub(crate) struct MemoryTrack {
    /// Amount from each time on; changes at one instant are merged into the last.
    pub samples: Vec<MemorySample>,
    /// Most microbatch-stages held at once, in the order the actions run.
    pub peak_count: u32,
    /// Most bytes held at once.
    pub peak_bytes: u64,
}

/// Stashed activations per device, from F starts and backward ends.
///
/// Changes are ordered by time, then by the position of their action in the device's order
/// (and a start before its own end): a device runs one action at a time, so this is the order
/// in which they happen, even when actions take no time at all.
pub(crate) fn memory_tracks(timeline: &Timeline, costs: &CostModel) -> Vec<MemoryTrack> {
    let n = timeline.meta.devices as usize;
    let mut per_device: Vec<Vec<&pipewright_schedule::timeline::Event>> = vec![Vec::new(); n];
    for e in timeline.compute_events() {
        if let Some(list) = per_device.get_mut(e.device as usize) {
            list.push(e);
        }
    }
    per_device
        .into_iter()
        .map(|mut events| {
            // Stable: events recorded in running order keep it when their starts tie.
            events.sort_by(|a, b| a.start.total_cmp(&b.start));
            track(&events, costs)
        })
        .collect()
}

/// (time, action position, 0 at its start or 1 at its end, change of count, change of bytes).
type Delta = (f64, usize, u8, i8, i128);

/// The schedule's [stash walk](pipewright_schedule::stash) over the device's events in running
/// order, weighed in bytes and placed in time. A microbatch with an `R` keeps only
/// [`CostModel::kept_bytes`] from the start of its F to the start of its R, and its whole
/// stash from then until its backward frees it; every other one keeps its whole stash (the
/// simulator has no recompute policy, so a stage without `R`s rebuilds nothing).
fn track(events: &[&pipewright_schedule::timeline::Event], costs: &CostModel) -> MemoryTrack {
    let row: Vec<_> = events.iter().map(|e| e.action).collect();
    let mut walk = StashWalk::new(&row);
    let mut deltas: Vec<Delta> = Vec::with_capacity(events.len());
    for (pos, e) in events.iter().enumerate() {
        // An overlap is its F (stashes at the start) and its B (frees at the end).
        for part in e.action.parts() {
            let (bytes, held) = costs.stages.get(part.stage as usize).map_or((0, 0), |c| {
                (
                    c.activation_bytes,
                    c.w_activation_bytes().min(c.activation_bytes),
                )
            });
            let kept = costs.kept_bytes(part.stage).min(bytes);
            let (bytes, held, kept) = (i128::from(bytes), i128::from(held), i128::from(kept));
            let (start, end) = ((e.start, pos, 0), (e.end, pos, 1));
            walk.step(part, |change| match change {
                Change::Stash(Form::Named) => deltas.push(at(start, 1, kept)),
                Change::Stash(_) => deltas.push(at(start, 1, bytes)),
                Change::Rebuild(Form::Named) if part.kind == ActionKind::R => {
                    deltas.push(at(start, 0, bytes - kept))
                }
                Change::Rebuild(_) => {}
                Change::Free(_) => deltas.push(at(end, -1, -bytes)),
                // I frees what W does not need; the microbatch-stage still counts until W.
                Change::Split(_) if held < bytes => deltas.push(at(end, 0, held - bytes)),
                Change::Split(_) => {}
                Change::FreeWeight => deltas.push(at(end, -1, -held)),
            });
        }
    }
    deltas.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let (mut count, mut bytes) = (0i64, 0i128);
    let (mut peak_count, mut peak_bytes) = (0u32, 0u64);
    let mut samples: Vec<MemorySample> = Vec::with_capacity(deltas.len() + 1);
    samples.push(MemorySample {
        time: 0.0,
        count: 0,
        bytes: 0,
    });
    for (time, _, _, sign, b) in deltas {
        count += i64::from(sign);
        bytes += b;
        let sample = MemorySample {
            time,
            count: count.clamp(0, i64::from(u32::MAX)) as u32,
            bytes: bytes.clamp(0, i128::from(u64::MAX)) as u64,
        };
        peak_count = peak_count.max(sample.count);
        peak_bytes = peak_bytes.max(sample.bytes);
        match samples.last_mut() {
            Some(last) if last.time == time => *last = sample,
            _ => samples.push(sample),
        }
    }
    MemoryTrack {
        samples,
        peak_count,
        peak_bytes,
    }
}

/// A change of `count` and `bytes` at `(time, position, phase)`.
fn at((time, pos, phase): (f64, usize, u8), count: i8, bytes: i128) -> Delta {
    (time, pos, phase, count, bytes)
}
