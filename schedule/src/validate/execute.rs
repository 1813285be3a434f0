//! Run every device's list in order, blocking where real devices would, to find deadlocks.
//!
//! A worklist of devices: each advances until its next action is not ready; finishing an
//! action wakes the one device that can be waiting on it (each hand-off has exactly one
//! consumer), so the whole run is linear in the number of actions.

use super::{Location, Positions, Problem, Semantics, ValidationError, Wait};
use crate::action::{Action, ActionKind};
use crate::timetable::Timetable;

const F_DONE: u8 = 1;
const BACK_DONE: u8 = 2;
const SENT_F: u8 = 4;
const SENT_B: u8 = 8;

struct Exec<'a> {
    tt: &'a Timetable,
    pos: &'a Positions,
    lowered: bool,
    semantics: Semantics,
    done: Vec<u8>,
    pc: Vec<usize>,
    queued: Vec<bool>,
    queue: Vec<u32>,
}

/// Execute; `Err` with a [`Problem::Deadlock`] naming every blocked device when stuck.
pub(super) fn run(
    tt: &Timetable,
    pos: &Positions,
    lowered: bool,
    semantics: Semantics,
) -> Result<(), ValidationError> {
    let n = tt.num_devices() as usize;
    let mut ex = Exec {
        tt,
        pos,
        lowered,
        semantics,
        done: vec![0; tt.num_stages() as usize * tt.microbatches as usize],
        pc: vec![0; n],
        queued: vec![true; n],
        queue: (0..n as u32).rev().collect(),
    };
    while let Some(d) = ex.queue.pop() {
        ex.queued[d as usize] = false;
        ex.advance(d);
    }
    let waits: Vec<Wait> = (0..n as u32).filter_map(|d| ex.blocked(d)).collect();
    match waits.first() {
        None => Ok(()),
        Some(w) => Err(ValidationError {
            at: Some(Location {
                device: w.device,
                step: Some((w.step, w.action)),
            }),
            problem: Problem::Deadlock(waits),
        }),
    }
}

impl Exec<'_> {
    fn dev(&self, stage: u32) -> u32 {
        self.tt.stage_device[stage as usize]
    }

    fn flag(&self, stage: u32, mb: u32) -> u8 {
        self.done[self.pos.key(stage, mb)]
    }

    fn set(&mut self, stage: u32, mb: u32, f: u8) {
        let k = self.pos.key(stage, mb);
        self.done[k] |= f;
    }

    fn wake(&mut self, d: u32) {
        if !self.queued[d as usize] {
            self.queued[d as usize] = true;
            self.queue.push(d);
        }
    }

    fn current(&self, d: u32) -> Option<Action> {
        self.tt.devices[d as usize]
            .get(self.pc[d as usize])
            .copied()
    }

    fn advance(&mut self, d: u32) {
        while let Some(a) = self.current(d) {
            if a.kind.is_comm() && self.semantics == Semantics::Rendezvous {
                let (peer, partner) = self.partner(a);
                if self.current(peer) != Some(partner) {
                    return;
                }
                self.pc[peer as usize] += 1;
                self.wake(peer);
            } else if self.waiting_for(d, a).is_some() {
                return;
            }
            self.pc[d as usize] += 1;
            self.complete(d, a);
        }
    }

    /// The action on another device that `a` (or a part of an overlap) needs and that has
    /// not happened yet.
    fn waiting_for(&self, d: u32, a: Action) -> Option<(u32, Action)> {
        a.parts().find_map(|part| self.part_waits_for(d, part))
    }

    fn part_waits_for(&self, d: u32, a: Action) -> Option<(u32, Action)> {
        use ActionKind::*;
        let (s, mb) = (a.stage, a.microbatch);
        let stages = self.tt.num_stages();
        let need = |stage: u32, flag: u8, kind: ActionKind| {
            (self.flag(stage, mb) & flag == 0)
                .then(|| (self.dev(stage), Action::new(stage, kind, mb)))
        };
        match a.kind {
            F if !self.lowered && s > 0 && self.dev(s - 1) != d => need(s - 1, F_DONE, F),
            B | I if !self.lowered && s + 1 < stages && self.dev(s + 1) != d => {
                need(s + 1, BACK_DONE, self.pos.back_kind(s + 1, mb))
            }
            RecvF => need(s - 1, SENT_F, SendF),
            RecvB => need(s + 1, SENT_B, SendB),
            _ => None,
        }
    }

    /// For a comm action: the peer device and the action there that pairs with it. The
    /// validator has checked every comm action has a peer stage before this runs.
    fn partner(&self, a: Action) -> (u32, Action) {
        let other = a.counterpart().unwrap_or(a);
        (self.dev(other.stage), other)
    }

    fn complete(&mut self, d: u32, a: Action) {
        for part in a.parts() {
            self.complete_part(d, part);
        }
    }

    fn complete_part(&mut self, d: u32, a: Action) {
        use ActionKind::*;
        let (s, mb) = (a.stage, a.microbatch);
        let stages = self.tt.num_stages();
        match a.kind {
            F => {
                self.set(s, mb, F_DONE);
                if !self.lowered && s + 1 < stages && self.dev(s + 1) != d {
                    self.wake(self.dev(s + 1));
                }
            }
            B | I => {
                self.set(s, mb, BACK_DONE);
                if !self.lowered && s > 0 && self.dev(s - 1) != d {
                    self.wake(self.dev(s - 1));
                }
            }
            SendF => {
                self.set(s, mb, SENT_F);
                self.wake(self.dev(s + 1));
            }
            SendB => {
                self.set(s, mb, SENT_B);
                self.wake(self.dev(s - 1));
            }
            W | R | RecvF | RecvB | Overlap { .. } => {}
        }
    }

    fn blocked(&self, d: u32) -> Option<Wait> {
        let action = self.current(d)?;
        let (on_device, waits_for) =
            if action.kind.is_comm() && self.semantics == Semantics::Rendezvous {
                self.partner(action)
            } else {
                self.waiting_for(d, action)?
            };
        let step = self.pc[d as usize] as u32;
        Some(Wait {
            device: d,
            step,
            action,
            waits_for,
            on_device,
        })
    }
}
