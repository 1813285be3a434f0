//! The figures of a step: makespan, bubbles, stashed activations over time.

use serde::{Deserialize, Serialize};

use super::CostModel;
use crate::action::ActionKind;
use crate::timeline::{MemorySample, Timeline};

/// Figures of one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// Device index.
    pub device: u32,
    /// Compute time.
    pub busy: f64,
    /// `1 - busy / makespan`.
    pub bubble_fraction: f64,
    /// Most microbatch-stages with stashed activations at once.
    pub peak_activations: u32,
    /// Most stashed activation bytes at once.
    pub peak_activation_bytes: u64,
    /// Stashed activations over time (a step function).
    pub memory: Vec<MemorySample>,
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
}

impl Report {
    /// Summarise a timeline; activation sizes come from `costs`.
    ///
    /// A stage-microbatch holds its activations from the start of its F to the end of its
    /// backward: the end of B, or of W when the backward is split (W still needs them).
    pub fn new(timeline: &Timeline, costs: &CostModel) -> Report {
        let makespan = timeline.makespan() - timeline.start();
        let busy = timeline.busy_per_device();
        let ideal = busy.iter().copied().fold(0.0, f64::max);
        let memory = memory_tracks(timeline, costs);
        let devices = busy
            .iter()
            .zip(memory)
            .enumerate()
            .map(|(d, (&busy, memory))| DeviceReport {
                device: d as u32,
                busy,
                bubble_fraction: fraction_idle(busy, makespan),
                peak_activations: memory.iter().map(|s| s.count).max().unwrap_or(0),
                peak_activation_bytes: memory.iter().map(|s| s.bytes).max().unwrap_or(0),
                memory,
            })
            .collect();
        Report {
            makespan,
            ideal,
            bubble_fraction: fraction_idle(ideal, makespan),
            time_unit: timeline.meta.time_unit.clone(),
            devices,
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

fn fraction_idle(busy: f64, span: f64) -> f64 {
    if span > 0.0 {
        (1.0 - busy / span).max(0.0)
    } else {
        0.0
    }
}

/// Step functions of stashed activations per device, from F starts and backward ends.
pub(crate) fn memory_tracks(timeline: &Timeline, costs: &CostModel) -> Vec<Vec<MemorySample>> {
    let n = timeline.meta.devices as usize;
    // (time, +1 or -1, bytes) per device; releases sort before allocations at equal times.
    let mut deltas: Vec<Vec<(f64, i8, u64)>> = vec![Vec::new(); n];
    for e in timeline.compute_events() {
        let Some(list) = deltas.get_mut(e.device as usize) else {
            continue;
        };
        // An overlap is its F (stashes at the start) and its B (frees at the end).
        for part in e.action.parts() {
            let bytes = costs
                .stages
                .get(part.stage as usize)
                .map_or(0, |c| c.activation_bytes);
            match part.kind {
                ActionKind::F => list.push((e.start, 1, bytes)),
                ActionKind::B | ActionKind::W => list.push((e.end, -1, bytes)),
                _ => {}
            }
        }
    }
    deltas.into_iter().map(samples).collect()
}

fn samples(mut deltas: Vec<(f64, i8, u64)>) -> Vec<MemorySample> {
    deltas.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut count, mut bytes) = (0i64, 0i128);
    let mut out: Vec<MemorySample> = Vec::with_capacity(deltas.len() + 1);
    out.push(MemorySample {
        time: 0.0,
        count: 0,
        bytes: 0,
    });
    for (time, sign, b) in deltas {
        count += i64::from(sign);
        bytes += i128::from(sign) * i128::from(b);
        let sample = MemorySample {
            time,
            count: count.max(0) as u32,
            bytes: bytes.max(0) as u64,
        };
        match out.last_mut() {
            Some(last) if last.time == time => *last = sample,
            _ => out.push(sample),
        }
    }
    out
}
