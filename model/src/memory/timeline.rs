//! One device's stashed activations and communication buffers on one timeline: a walk of its
//! lowered actions (sends and receives included) in the runtime's order, so that the peak of
//! their sum, and what each held at that moment, are the figures the runtime measures.
//!
//! Buffers, as the runtime counts them:
//! - a hand-off (a stage's output or input gradient) from the compute that makes it until its
//!   send, or until the compute of a stage on the same device that uses it; a received one
//!   from its receive until its use;
//! - a stage's flat gradients from the end of the action holding its last backward (B or W)
//!   until its data-parallel reduction is waited for at the step's end; under ZeRO-1 each
//!   stage in turn then holds its reduced shard with the whole flat tensor, while the
//!   updated values are gathered.
//!
//! Approximated: a receive counts from its action in the row, as the runtime does, though
//! the transport may have the bytes earlier; collectives' internal copies and the in-flight
//! bytes of a send are the transport's, not counted on either side.

use std::collections::HashMap;

use super::walk::{StageBytes, Stashes};
use pipewright_schedule::action::{Action, ActionKind};

/// What a device's buffers are made of, in bytes.
#[derive(Clone, Debug, Default)]
pub(super) struct BufferBytes {
    /// One pipeline hand-off.
    pub handoff: f64,
    /// Per stage, its output's hand-off where stages differ (a layer-list model); `None`:
    /// every hand-off is `handoff`.
    pub outputs: Option<Vec<f64>>,
    /// Per stage, its flat gradients under reduction (0 where nothing is reduced).
    pub grads: Vec<f64>,
    /// Per stage, the rank's ZeRO-1 shard of them (`None` without ZeRO-1).
    pub shards: Option<Vec<f64>>,
}

impl BufferBytes {
    /// Stage `s`'s output (and the gradient of it that comes back).
    fn output(&self, s: u32) -> f64 {
        match &self.outputs {
            Some(o) => o.get(s as usize).copied().unwrap_or(0.0),
            None => self.handoff,
        }
    }

    /// Stage `s`'s input (and the gradient of it that it sends back).
    fn input(&self, s: u32) -> f64 {
        match s {
            0 => 0.0,
            s => self.output(s - 1),
        }
    }
}

/// Activations and buffers of a device: at the moment their sum peaks (the earliest such
/// moment), and each one's own maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Levels {
    /// `(activations, buffers)` at the highest sum.
    pub peak: (f64, f64),
    /// The highest activations.
    pub max_activations: f64,
    /// The highest buffers.
    pub max_buffers: f64,
}

impl Levels {
    /// Count the moment after something grew: the runtime compares with its peak only then.
    fn see(&mut self, activations: f64, buffers: f64) {
        if activations + buffers > self.peak.0 + self.peak.1 {
            self.peak = (activations, buffers);
        }
        self.max_activations = self.max_activations.max(activations);
        self.max_buffers = self.max_buffers.max(buffers);
    }
}

/// The walk of one lowered device row of a pipeline of `num_stages` stages.
pub(super) fn device_levels(
    row: &[Action],
    num_stages: u32,
    stages: &[StageBytes],
    buf: &BufferBytes,
) -> Levels {
    let mut levels = Levels::default();
    let mut held = Stashes::new(row);
    let mut buffers = 0.0f64;
    let grads = |s: u32| buf.grads.get(s as usize).copied().unwrap_or(0.0);
    let last = last_backward_per_stage(row);
    let mut pending = Vec::new();
    for (i, a) in row.iter().enumerate() {
        match a.kind {
            // A stage receives its input and its output's gradient, sends its output and its
            // input's gradient.
            ActionKind::RecvF | ActionKind::RecvB => {
                buffers += if a.kind == ActionKind::RecvF {
                    buf.input(a.stage)
                } else {
                    buf.output(a.stage)
                };
                levels.see(held.now, buffers);
            }
            ActionKind::SendF => buffers -= buf.output(a.stage),
            ActionKind::SendB => buffers -= buf.input(a.stage),
            _ => {
                for part in a.parts() {
                    let (first, last_stage) = (part.stage == 0, part.stage + 1 == num_stages);
                    let (input, output) = (buf.input(part.stage), buf.output(part.stage));
                    let (takes, makes) = match part.kind {
                        ActionKind::F => {
                            ((!first).then_some(input), (!last_stage).then_some(output))
                        }
                        ActionKind::B | ActionKind::I => {
                            ((!last_stage).then_some(output), (!first).then_some(input))
                        }
                        _ => (None, None),
                    };
                    if let Some(b) = takes {
                        buffers -= b;
                    }
                    held.apply(part, stages, |act| levels.see(act, buffers));
                    if let Some(b) = makes {
                        buffers += b;
                        levels.see(held.now, buffers);
                    }
                }
            }
        }
        for part in a.parts() {
            if last.get(&part.stage) == Some(&i) && grads(part.stage) > 0.0 {
                buffers += grads(part.stage);
                levels.see(held.now, buffers);
                pending.push(part.stage);
            }
        }
    }
    // The step's end: reductions waited for in the order they started.
    if let Some(shards) = &buf.shards {
        for s in pending {
            let (whole, shard) = (grads(s), shards.get(s as usize).copied().unwrap_or(0.0));
            buffers += shard - whole;
            levels.see(held.now, buffers);
            buffers += whole;
            levels.see(held.now, buffers);
            buffers -= shard + whole;
        }
    }
    levels
}

/// Index in `row` of each stage's last backward (B or W): where its gradients are final.
fn last_backward_per_stage(row: &[Action]) -> HashMap<u32, usize> {
    row.iter()
        .enumerate()
        .flat_map(|(i, a)| a.parts().map(move |p| (i, p)))
        .filter(|(_, p)| matches!(p.kind, ActionKind::B | ActionKind::W))
        .map(|(i, p)| (p.stage, i))
        .collect()
}
