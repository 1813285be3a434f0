//! The validator: proves a timetable complete, ordered, paired and deadlock-free.
//!
//! Checks run from cheap and local to global, so the first error found is the most specific:
//! 1. every action names a real stage and microbatch, on the device holding that stage;
//! 2. each (stage, microbatch) has one F and one backward (B, or I and W), nothing twice;
//! 3. on each device, F comes before its backward, I before W, a recompute `R` (optional,
//!    at most one) between its F and its backward, and a stage's local predecessor (same
//!    device) before it;
//! 4. in a lowered timetable, every cross-device hand-off has its send after the producer and
//!    its receive before the consumer;
//! 5. executing every device in order, with blocking receives (and, with
//!    [`Semantics::Rendezvous`], blocking sends), every device finishes: no deadlock.

use crate::action::{Action, ActionKind};
use crate::spec::MAX_ACTIONS;
use crate::timetable::Timetable;

mod error;
mod execute;

pub use error::{Location, Problem, ValidationError, Wait};

/// How sends behave when the validator executes a lowered timetable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Semantics {
    /// Sends are posted and return (as pipewright's runtime, MPI `Isend`, and PyTorch's
    /// batched P2P do); receives block until the matching send has been posted.
    #[default]
    Buffered,
    /// A send also blocks until the peer reaches the matching receive (`MPI_Ssend`, an
    /// ungrouped NCCL send). Stricter: some timetables that run buffered deadlock here.
    Rendezvous,
}

/// Facts the validator established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validated {
    /// The timetable carries its sends and receives.
    pub lowered: bool,
    /// Compute actions in it.
    pub compute_actions: usize,
}

const NONE: u32 = u32::MAX;

/// Step of each action kind for each (stage, microbatch), `NONE` where absent.
pub(crate) struct Positions {
    m: u32,
    pos: Vec<[u32; 9]>,
}

impl Positions {
    pub(crate) fn key(&self, stage: u32, mb: u32) -> usize {
        stage as usize * self.m as usize + mb as usize
    }

    pub(crate) fn get(&self, kind: ActionKind, stage: u32, mb: u32) -> Option<u32> {
        let p = self.pos[self.key(stage, mb)][kind.index()];
        (p != NONE).then_some(p)
    }

    /// Step of the input-gradient backward (B or I).
    pub(crate) fn back(&self, stage: u32, mb: u32) -> Option<u32> {
        self.get(ActionKind::B, stage, mb)
            .or_else(|| self.get(ActionKind::I, stage, mb))
    }

    /// Kind of the input-gradient backward: B when the backward is whole, else I.
    pub(crate) fn back_kind(&self, stage: u32, mb: u32) -> ActionKind {
        match self.get(ActionKind::B, stage, mb) {
            Some(_) => ActionKind::B,
            None => ActionKind::I,
        }
    }
}

/// Validate with the default (buffered-send) semantics.
pub fn validate(tt: &Timetable) -> Result<Validated, ValidationError> {
    validate_with(tt, Semantics::Buffered)
}

/// Validate with the given send semantics.
pub fn validate_with(tt: &Timetable, semantics: Semantics) -> Result<Validated, ValidationError> {
    check_shape(tt)?;
    let positions = index_actions(tt)?;
    check_complete(tt, &positions)?;
    check_local_order(tt, &positions)?;
    let lowered = tt.is_lowered();
    if lowered {
        check_comm_pairs(tt, &positions)?;
    }
    execute::run(tt, &positions, lowered, semantics)?;
    Ok(Validated {
        lowered,
        compute_actions: tt.compute_len(),
    })
}

fn check_shape(tt: &Timetable) -> Result<(), ValidationError> {
    let devices = tt.num_devices();
    if devices == 0 {
        return Err(ValidationError::new(Problem::NoDevices));
    }
    for (stage, &device) in tt.stage_device.iter().enumerate() {
        if device >= devices {
            let stage = stage as u32;
            return Err(ValidationError::new(Problem::NoSuchDevice {
                stage,
                device,
                devices,
            }));
        }
    }
    let keys = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
    if keys > MAX_ACTIONS {
        return Err(ValidationError::new(Problem::TooLarge(keys)));
    }
    Ok(())
}

/// Range and placement checks of every action, then the forwards counted: a timetable
/// whose numbers name more stage-microbatches than it has forwards is incomplete, and is
/// refused before the dense index is built, so that a file naming microbatch 268435455 in
/// one cell costs what its cells cost, not a table of every number below it.
fn check_sparse(tt: &Timetable) -> Result<(), ValidationError> {
    let m = tt.microbatches;
    let mut forwards = 0u64;
    for (d, actions) in tt.devices.iter().enumerate() {
        let d = d as u32;
        for (step, &whole) in actions.iter().enumerate() {
            for a in whole.parts() {
                index_one(tt, m, d, a)
                    .map_err(|problem| ValidationError::at(d, step as u32, whole, problem))?;
                forwards += u64::from(a.kind == ActionKind::F);
            }
        }
    }
    let keys = u64::from(tt.num_stages()) * u64::from(m);
    if forwards >= keys {
        return Ok(());
    }
    // The first missing forward in (stage, microbatch) order lies within the first
    // `forwards + 1` keys.
    let present: std::collections::HashSet<(u32, u32)> = tt
        .devices
        .iter()
        .flatten()
        .flat_map(|a| a.parts())
        .filter(|a| a.kind == ActionKind::F)
        .map(|a| (a.stage, a.microbatch))
        .collect();
    let missing = (0..tt.num_stages())
        .flat_map(|s| (0..m).map(move |mb| (s, mb)))
        .find(|k| !present.contains(k));
    match missing {
        Some((stage, mb)) => Err(ValidationError::on(
            tt.stage_device[stage as usize],
            Problem::MissingForward(Action::new(stage, ActionKind::F, mb)),
        )),
        None => Ok(()),
    }
}

/// Duplicate checks, building the position index (ranges checked by [`check_sparse`]).
fn index_actions(tt: &Timetable) -> Result<Positions, ValidationError> {
    check_sparse(tt)?;
    let (stages, m) = (tt.num_stages(), tt.microbatches);
    let mut p = Positions {
        m,
        pos: vec![[NONE; 9]; stages as usize * m as usize],
    };
    for (d, actions) in tt.devices.iter().enumerate() {
        let d = d as u32;
        for (step, &whole) in actions.iter().enumerate() {
            let step = step as u32;
            let err = |problem| ValidationError::at(d, step, whole, problem);
            // An overlap's F and B both sit at its step: later checks see two actions there.
            for a in whole.parts() {
                let key = p.key(a.stage, a.microbatch);
                let slot = &mut p.pos[key][a.kind.index()];
                if *slot != NONE {
                    return Err(err(Problem::Duplicate { first_step: *slot }));
                }
                *slot = step;
            }
        }
    }
    Ok(p)
}

/// Range, placement and peer checks of one simple action on device `d`.
fn index_one(tt: &Timetable, m: u32, d: u32, a: Action) -> Result<(), Problem> {
    let stages = tt.num_stages();
    if a.stage >= stages {
        return Err(Problem::NoSuchStage {
            stage: a.stage,
            stages,
        });
    }
    if a.microbatch >= m {
        return Err(Problem::NoSuchMicrobatch {
            microbatch: a.microbatch,
            microbatches: m,
        });
    }
    let owner = tt.stage_device[a.stage as usize];
    if owner != d {
        return Err(Problem::WrongDevice {
            stage: a.stage,
            owner,
        });
    }
    match comm_peer_problem(tt, a) {
        Some(why) => Err(Problem::NoPeer(why)),
        None => Ok(()),
    }
}

/// A comm action must connect its stage to a neighbour on another device.
fn comm_peer_problem(tt: &Timetable, a: Action) -> Option<&'static str> {
    let stages = tt.num_stages();
    let peer = match a.kind {
        ActionKind::SendF | ActionKind::RecvB => {
            if a.stage + 1 >= stages {
                return Some("the last stage has no next stage");
            }
            a.stage + 1
        }
        ActionKind::RecvF | ActionKind::SendB => {
            if a.stage == 0 {
                return Some("the first stage has no previous stage");
            }
            a.stage - 1
        }
        _ => return None,
    };
    (tt.stage_device[peer as usize] == tt.stage_device[a.stage as usize])
        .then_some("both stages are on this device, which hands off in memory")
}

fn check_complete(tt: &Timetable, p: &Positions) -> Result<(), ValidationError> {
    use ActionKind::*;
    for stage in 0..tt.num_stages() {
        let d = tt.stage_device[stage as usize];
        for mb in 0..tt.microbatches {
            let at = |kind: ActionKind, step: u32, problem| {
                ValidationError::at(d, step, Action::new(stage, kind, mb), problem)
            };
            if p.get(F, stage, mb).is_none() {
                return Err(ValidationError::on(
                    d,
                    Problem::MissingForward(Action::new(stage, F, mb)),
                ));
            }
            match (
                p.get(B, stage, mb),
                p.get(I, stage, mb),
                p.get(W, stage, mb),
            ) {
                (Some(b), Some(i), _) => {
                    return Err(at(B, b, Problem::BothBackwards { other_step: i }))
                }
                (Some(b), None, Some(w)) => {
                    return Err(at(B, b, Problem::BothBackwards { other_step: w }))
                }
                (None, Some(i), None) => return Err(at(I, i, Problem::MissingW)),
                (None, None, Some(w)) => return Err(at(W, w, Problem::WWithoutI)),
                (None, None, None) => {
                    return Err(ValidationError::on(
                        d,
                        Problem::MissingBackward {
                            stage,
                            microbatch: mb,
                        },
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn check_local_order(tt: &Timetable, p: &Positions) -> Result<(), ValidationError> {
    use ActionKind::*;
    let stages = tt.num_stages();
    for stage in 0..stages {
        let d = tt.stage_device[stage as usize];
        let same_dev = |s: u32| tt.stage_device[s as usize] == d;
        for mb in 0..tt.microbatches {
            let act = |kind| Action::new(stage, kind, mb);
            let f = p.get(F, stage, mb).unwrap_or(NONE);
            let back = p.back(stage, mb).unwrap_or(NONE);
            let back_kind = p.back_kind(stage, mb);
            // `<=`: an overlap's B cannot use its own F, which runs at the same time.
            if back <= f {
                let problem = Problem::BackwardBeforeForward {
                    forward: act(F),
                    forward_step: f,
                };
                return Err(ValidationError::at(d, back, act(back_kind), problem));
            }
            if let Some(r) = p.get(R, stage, mb) {
                check_recompute(d, act, (f, r, back, back_kind))?;
            }
            if let (Some(i), Some(w)) = (p.get(I, stage, mb), p.get(W, stage, mb)) {
                if w < i {
                    return Err(ValidationError::at(
                        d,
                        w,
                        act(W),
                        Problem::WBeforeI {
                            i: act(I),
                            i_step: i,
                        },
                    ));
                }
            }
            if stage > 0 && same_dev(stage - 1) {
                let dep = p.get(F, stage - 1, mb).unwrap_or(NONE);
                if dep >= f {
                    let problem = Problem::DependencyLater {
                        dep: Action::new(stage - 1, F, mb),
                        dep_step: dep,
                    };
                    return Err(ValidationError::at(d, f, act(F), problem));
                }
            }
            if stage + 1 < stages && same_dev(stage + 1) {
                let dep = p.back(stage + 1, mb).unwrap_or(NONE);
                if dep >= back {
                    let dep_kind = p.back_kind(stage + 1, mb);
                    let problem = Problem::DependencyLater {
                        dep: Action::new(stage + 1, dep_kind, mb),
                        dep_step: dep,
                    };
                    return Err(ValidationError::at(d, back, act(back_kind), problem));
                }
            }
        }
    }
    Ok(())
}

/// An `R` runs strictly after its F and strictly before its backward (B or I), on the
/// stage's device (which `index_one` has checked).
fn check_recompute(
    d: u32,
    act: impl Fn(ActionKind) -> Action,
    (f, r, back, back_kind): (u32, u32, u32, ActionKind),
) -> Result<(), ValidationError> {
    if r <= f {
        let problem = Problem::RecomputeBeforeForward {
            forward: act(ActionKind::F),
            forward_step: f,
        };
        return Err(ValidationError::at(d, r, act(ActionKind::R), problem));
    }
    if r >= back {
        let problem = Problem::RecomputeAfterBackward {
            backward: act(back_kind),
            backward_step: back,
        };
        return Err(ValidationError::at(d, r, act(ActionKind::R), problem));
    }
    Ok(())
}

/// Each cross-device edge needs its send after the producer and its receive before the consumer.
fn check_comm_pairs(tt: &Timetable, p: &Positions) -> Result<(), ValidationError> {
    use ActionKind::*;
    let stages = tt.num_stages();
    for s in 0..stages.saturating_sub(1) {
        let (d0, d1) = (tt.stage_device[s as usize], tt.stage_device[s as usize + 1]);
        if d0 == d1 {
            continue;
        }
        for mb in 0..tt.microbatches {
            let fwd = (s, F, p.get(F, s, mb), SendF);
            let fwd_use = (s + 1, F, p.get(F, s + 1, mb), RecvF);
            let bwd = (s + 1, p.back_kind(s + 1, mb), p.back(s + 1, mb), SendB);
            let bwd_use = (s, p.back_kind(s, mb), p.back(s, mb), RecvB);
            check_edge(p, mb, (d0, fwd), (d1, fwd_use))?;
            check_edge(p, mb, (d1, bwd), (d0, bwd_use))?;
        }
    }
    Ok(())
}

type EdgeEnd = (u32, (u32, ActionKind, Option<u32>, ActionKind));

fn check_edge(p: &Positions, mb: u32, from: EdgeEnd, to: EdgeEnd) -> Result<(), ValidationError> {
    let (d_from, (s_from, k_from, step_from, send_kind)) = from;
    let (d_to, (s_to, k_to, step_to, recv_kind)) = to;
    let (step_from, step_to) = (step_from.unwrap_or(NONE), step_to.unwrap_or(NONE));
    let producer = Action::new(s_from, k_from, mb);
    let consumer = Action::new(s_to, k_to, mb);
    let send = Action::new(s_from, send_kind, mb);
    let recv = Action::new(s_to, recv_kind, mb);
    match p.get(send_kind, s_from, mb) {
        None => {
            let problem = Problem::MissingSend { send, to: d_to };
            return Err(ValidationError::at(d_from, step_from, producer, problem));
        }
        Some(st) if st < step_from => {
            let problem = Problem::SendBeforeProducer {
                producer,
                producer_step: step_from,
            };
            return Err(ValidationError::at(d_from, st, send, problem));
        }
        Some(_) => {}
    }
    match p.get(recv_kind, s_to, mb) {
        None => {
            let problem = Problem::MissingRecv { recv, from: d_from };
            Err(ValidationError::at(d_to, step_to, consumer, problem))
        }
        Some(st) if st > step_to => {
            let problem = Problem::RecvAfterUse {
                user: consumer,
                user_step: step_to,
            };
            Err(ValidationError::at(d_to, st, recv, problem))
        }
        Some(_) => Ok(()),
    }
}
