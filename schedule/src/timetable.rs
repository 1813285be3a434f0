//! `Timetable`: one ordered list of actions per device, and the stage-to-device map.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind};
use crate::spec::Placement;

/// A complete plan of one training step: for each device, the actions it runs, in order.
///
/// Nothing about it is implicit: which device holds which stage is spelled out in
/// `stage_device`, and communication appears as actions once [`lower`](crate::lower) has run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timetable {
    /// Name of the schedule that made it (`custom` for imported ones).
    #[serde(default = "custom")]
    pub name: String,
    /// Microbatches per step, `m`.
    pub microbatches: u32,
    /// Device of each stage; its length is the number of stages `S`.
    pub stage_device: Vec<u32>,
    /// Actions per device, in execution order; its length is the number of devices `p`.
    pub devices: Vec<Vec<Action>>,
}

fn custom() -> String {
    "custom".to_string()
}

impl Timetable {
    /// An empty timetable for `p` devices holding `stages` stages placed by `placement`.
    pub fn empty(name: &str, p: u32, stages: u32, microbatches: u32, placement: Placement) -> Self {
        Timetable {
            name: name.to_string(),
            microbatches,
            stage_device: (0..stages).map(|s| placement.device_of(s, p)).collect(),
            devices: vec![Vec::new(); p as usize],
        }
    }

    /// The same microbatches, stage placement and actions per device, whatever the names
    /// (a label of where it came from: `custom` once read back from a file).
    pub fn same_content(&self, other: &Timetable) -> bool {
        self.microbatches == other.microbatches
            && self.stage_device == other.stage_device
            && self.devices == other.devices
    }

    /// Number of devices `p`.
    pub fn num_devices(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Number of stages `S`.
    pub fn num_stages(&self) -> u32 {
        self.stage_device.len() as u32
    }

    /// Device holding `stage`, if the stage exists.
    pub fn device_of(&self, stage: u32) -> Option<u32> {
        self.stage_device.get(stage as usize).copied()
    }

    /// Total number of actions over all devices.
    pub fn len(&self) -> usize {
        self.devices.iter().map(Vec::len).sum()
    }

    /// True when no device has any action.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when any device has a send or receive: the timetable has been lowered.
    pub fn is_lowered(&self) -> bool {
        self.devices.iter().flatten().any(|a| a.kind.is_comm())
    }

    /// Number of compute actions.
    pub fn compute_len(&self) -> usize {
        self.devices
            .iter()
            .flatten()
            .filter(|a| a.kind.is_compute())
            .count()
    }

    /// The same timetable without sends and receives.
    pub fn compute_only(&self) -> Timetable {
        Timetable {
            devices: self
                .devices
                .iter()
                .map(|d| d.iter().copied().filter(|a| a.kind.is_compute()).collect())
                .collect(),
            ..self.clone()
        }
    }

    /// A readable grid: one row per device, one column per step. `mark` puts `>...<`
    /// around the action at (device, step), for pointing at an error.
    pub fn grid(&self, mark: Option<(u32, u32)>) -> String {
        let width = self
            .devices
            .iter()
            .flatten()
            .map(|a| a.to_string().len())
            .max()
            .unwrap_or(3)
            + 3; // room for the `>...<` of a marked cell and a space
        let steps = self.devices.iter().map(Vec::len).max().unwrap_or(0);
        let label = format!("dev {}", self.devices.len().saturating_sub(1)).len();
        let mut out = String::new();
        let _ = write!(out, "{:label$} |", "step");
        for i in 0..steps {
            let _ = write!(out, "{:>width$}", i);
        }
        out.push('\n');
        for (d, actions) in self.devices.iter().enumerate() {
            let _ = write!(out, "{:label$} |", format!("dev {d}"));
            for (i, a) in actions.iter().enumerate() {
                let cell = if mark == Some((d as u32, i as u32)) {
                    format!(">{a}<")
                } else {
                    a.to_string()
                };
                let _ = write!(out, "{cell:>width$}");
            }
            out.push('\n');
        }
        out
    }
}

/// Why a timetable could not be lowered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LowerError {
    /// Sends and receives are already present.
    #[error("device {device}, step {step}: {action} is a send or receive; the timetable is already lowered")]
    AlreadyLowered {
        /// Device.
        device: u32,
        /// Step.
        step: u32,
        /// The comm action found.
        action: Action,
    },
    /// An action names a stage the timetable does not have.
    #[error("device {device}, step {step}: {action} names stage {stage}, but there are only {stages} stages")]
    NoSuchStage {
        /// Device.
        device: u32,
        /// Step.
        step: u32,
        /// The action.
        action: Action,
        /// Its stage.
        stage: u32,
        /// Stage count.
        stages: u32,
    },
}

/// Add the sends and receives a compute-only timetable needs: a receive right before each
/// compute action whose input lives on another device, a send right after each compute action
/// whose output another device needs. Stages on one device hand off in memory, with no action.
pub fn lower(tt: &Timetable) -> Result<Timetable, LowerError> {
    let stages = tt.num_stages();
    let mut devices = Vec::with_capacity(tt.devices.len());
    for (d, actions) in tt.devices.iter().enumerate() {
        let d = d as u32;
        let mut out = Vec::with_capacity(actions.len() * 2);
        for (step, &a) in actions.iter().enumerate() {
            let step = step as u32;
            if a.kind.is_comm() {
                return Err(LowerError::AlreadyLowered {
                    device: d,
                    step,
                    action: a,
                });
            }
            if let Some(bad) = a.parts().find(|p| p.stage >= stages) {
                return Err(LowerError::NoSuchStage {
                    device: d,
                    step,
                    action: a,
                    stage: bad.stage,
                    stages,
                });
            }
            let parts = || a.parts();
            // Receives of every part first, then the action, then the sends: an overlap's F
            // and B both have their inputs before it starts and send once it is done.
            out.extend(parts().filter_map(|p| comm_for(tt, d, p, false)));
            out.push(a);
            out.extend(parts().filter_map(|p| comm_for(tt, d, p, true)));
        }
        devices.push(out);
    }
    Ok(Timetable {
        devices,
        ..tt.clone()
    })
}

/// The receive (`send == false`) or send a simple compute action `a` on device `d` needs:
/// F takes its input from the previous stage and sends to the next; B and I the reverse.
fn comm_for(tt: &Timetable, d: u32, a: Action, send: bool) -> Option<Action> {
    let (s, mb) = (a.stage, a.microbatch);
    let remote = |t: u32| tt.stage_device[t as usize] != d;
    let prev_remote = s > 0 && remote(s - 1);
    let next_remote = s + 1 < tt.num_stages() && remote(s + 1);
    let kind = match (a.kind, send) {
        (ActionKind::F, false) if prev_remote => ActionKind::RecvF,
        (ActionKind::F, true) if next_remote => ActionKind::SendF,
        (ActionKind::B | ActionKind::I, false) if next_remote => ActionKind::RecvB,
        (ActionKind::B | ActionKind::I, true) if prev_remote => ActionKind::SendB,
        _ => return None,
    };
    Some(Action::new(s, kind, mb))
}
