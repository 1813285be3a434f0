//! What the validator reports: where in a timetable ([`Location`]), what is wrong
//! ([`Problem`]), and the error that carries both ([`ValidationError`]).

use std::fmt;

use crate::action::Action;
use crate::spec::MAX_ACTIONS;
use crate::timetable::Timetable;

/// Where in a timetable an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Device (row).
    pub device: u32,
    /// Step (column) and the action there, when the error is about one action.
    pub step: Option<(u32, Action)>,
}

/// What is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// No devices at all.
    #[error("the timetable has no devices")]
    NoDevices,
    /// The stage-device map sends a stage to a device that does not exist.
    #[error("stage {stage} is placed on device {device}, but there are only {devices} devices")]
    NoSuchDevice {
        /// Stage.
        stage: u32,
        /// Its device.
        device: u32,
        /// Device count.
        devices: u32,
    },
    /// Too many stage-microbatches to check.
    #[error("{0} stage-microbatches is more than the limit of {MAX_ACTIONS}")]
    TooLarge(u64),
    /// The action's stage is out of range.
    #[error("stage {stage} does not exist (the timetable has {stages} stages)")]
    NoSuchStage {
        /// Stage named.
        stage: u32,
        /// Stage count.
        stages: u32,
    },
    /// The action's microbatch is out of range.
    #[error(
        "microbatch {microbatch} does not exist (the timetable has {microbatches} microbatches)"
    )]
    NoSuchMicrobatch {
        /// Microbatch named.
        microbatch: u32,
        /// Microbatch count.
        microbatches: u32,
    },
    /// The action runs on a device that does not hold its stage.
    #[error("stage {stage} lives on device {owner}, not here")]
    WrongDevice {
        /// Stage.
        stage: u32,
        /// Device that holds it.
        owner: u32,
    },
    /// A send or receive between stages that have no peer on another device.
    #[error("no peer: {0}")]
    NoPeer(&'static str),
    /// The same action twice.
    #[error("duplicated: the same action is already at step {first_step} of this device")]
    Duplicate {
        /// Where it first appears.
        first_step: u32,
    },
    /// A (stage, microbatch) has no forward.
    #[error("{0} is missing: stage {s} microbatch {mb} has no forward", s = .0.stage, mb = .0.microbatch)]
    MissingForward(Action),
    /// A (stage, microbatch) has no backward.
    #[error("stage {stage} microbatch {microbatch} has no backward (B, or I and W)")]
    MissingBackward {
        /// Stage.
        stage: u32,
        /// Microbatch.
        microbatch: u32,
    },
    /// Both a full backward and a split one.
    #[error("has both a full backward B and a split one (step {other_step}); use B, or I and W")]
    BothBackwards {
        /// Step of the other one.
        other_step: u32,
    },
    /// I without its W.
    #[error("has no matching W: the weight gradient would never be computed")]
    MissingW,
    /// W without its I.
    #[error("has no matching I before it: W needs the input-gradient pass first")]
    WWithoutI,
    /// A backward before its forward.
    #[error("backward before its forward {forward} (step {forward_step})")]
    BackwardBeforeForward {
        /// The forward.
        forward: Action,
        /// Its step.
        forward_step: u32,
    },
    /// W before its I.
    #[error("W before its I {i} (step {i_step})")]
    WBeforeI {
        /// The I.
        i: Action,
        /// Its step.
        i_step: u32,
    },
    /// A recompute before its forward has run.
    #[error("recompute before its forward {forward} (step {forward_step})")]
    RecomputeBeforeForward {
        /// The forward.
        forward: Action,
        /// Its step.
        forward_step: u32,
    },
    /// A recompute after the backward that needs it.
    #[error("recompute after its backward {backward} (step {backward_step}): it must come between its F and its backward")]
    RecomputeAfterBackward {
        /// The backward (B or I).
        backward: Action,
        /// Its step.
        backward_step: u32,
    },
    /// A same-device dependency comes later.
    #[error("needs {dep} first, but it comes later on this device (step {dep_step})")]
    DependencyLater {
        /// The dependency.
        dep: Action,
        /// Its step.
        dep_step: u32,
    },
    /// A cross-device input without its receive.
    #[error("needs {recv} before it: its input comes from device {from}")]
    MissingRecv {
        /// The receive that should precede.
        recv: Action,
        /// Device that produces the input.
        from: u32,
    },
    /// A receive after the action that uses it.
    #[error("comes after its use {user} (step {user_step})")]
    RecvAfterUse {
        /// The consumer.
        user: Action,
        /// Its step.
        user_step: u32,
    },
    /// A cross-device output without its send.
    #[error("needs {send} after it: device {to} waits for its output")]
    MissingSend {
        /// The send that should follow.
        send: Action,
        /// Device that consumes the output.
        to: u32,
    },
    /// A send before the compute that produces what it sends.
    #[error("sends before {producer} (step {producer_step}) has produced it")]
    SendBeforeProducer {
        /// The producer.
        producer: Action,
        /// Its step.
        producer_step: u32,
    },
    /// Nothing can move.
    #[error("deadlock: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Deadlock(Vec<Wait>),
}

/// One blocked device in a deadlock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    /// Blocked device.
    pub device: u32,
    /// Its step.
    pub step: u32,
    /// Its action.
    pub action: Action,
    /// What it waits for.
    pub waits_for: Action,
    /// On which device.
    pub on_device: u32,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {} step {} ({}) waits for {} on device {}",
            self.device, self.step, self.action, self.waits_for, self.on_device
        )
    }
}

/// A timetable's first error, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// Where, when the error is about a device or one action.
    pub at: Option<Location>,
    /// What.
    pub problem: Problem,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(Location {
                device,
                step: Some((step, action)),
            }) => {
                write!(
                    f,
                    "device {device}, step {step} ({action}): {}",
                    self.problem
                )
            }
            Some(Location { device, step: None }) => write!(f, "device {device}: {}", self.problem),
            None => write!(f, "{}", self.problem),
        }
    }
}

impl std::error::Error for ValidationError {}

impl ValidationError {
    pub(super) fn new(problem: Problem) -> Self {
        ValidationError { at: None, problem }
    }

    pub(super) fn at(device: u32, step: u32, action: Action, problem: Problem) -> Self {
        ValidationError {
            at: Some(Location {
                device,
                step: Some((step, action)),
            }),
            problem,
        }
    }

    pub(super) fn on(device: u32, problem: Problem) -> Self {
        ValidationError {
            at: Some(Location { device, step: None }),
            problem,
        }
    }

    /// The timetable's grid with the failing step marked, for printing under the error.
    pub fn grid(&self, tt: &Timetable) -> String {
        let mark = self.at.and_then(|l| l.step.map(|(s, _)| (l.device, s)));
        tt.grid(mark)
    }
}
