//! The checks of a PyTorch compute+comms CSV's own cells, which PyTorch runs as written:
//! every send waited for once after it ([`Sends`]), gradient reductions paired with their
//! waits, one pending at a time ([`Reductions`]: what `_load_csv(format="compute_comms")`
//! checks), and each hand-off's send after its maker and receive before its user, none
//! extra and none twice ([`check_handoffs`]: what PyTorch's runtime asserts or hangs on).
//! [`super::csv`] reads the file and calls them.

use std::collections::HashMap;

use super::error::CsvError;
use crate::action::{Action, ActionKind};

/// PyTorch runs a compute+comms file's own sends and receives as written: a hand-off between
/// two devices needs its send after the action that makes the data, in that action's row, and
/// its receive before the action that uses it, in that one's row (PyTorch's runtime asserts
/// the receive before it computes, and a missing send leaves its receiver waiting for ever).
/// A send or receive that no hand-off needs, or one posted twice, is refused too. A user the
/// file lacks is left to validation, which names it.
pub(super) fn check_handoffs(
    devices: &[Vec<Action>],
    cells: &[Vec<(usize, usize)>],
    stage_device: &[u32],
    microbatches: u32,
) -> Result<(), CsvError> {
    let stages = stage_device.len() as u32;
    let forwards = devices
        .iter()
        .flatten()
        .flat_map(|a| a.parts())
        .filter(|p| p.kind == ActionKind::F)
        .count() as u64;
    // A complete timetable has a forward for every (stage, microbatch); one that has not is
    // refused by validation, naming what is missing, and needs no table sized by it.
    if u64::from(stages) * u64::from(microbatches) > forwards {
        return Ok(());
    }
    let mut at = place(devices, cells, Positions::new(stages, microbatches))?;
    check_pairs(devices, cells, stage_device, &mut at)?;
    check_needed(devices, cells, stages, &at)
}

/// A hand-off error at the cell of row `d`'s action `i`.
fn handoff_error(
    cells: &[Vec<(usize, usize)>],
    (d, i): (usize, usize),
    message: String,
) -> CsvError {
    let (line, column) = cells[d][i];
    CsvError::Handoff {
        line,
        column,
        message,
    }
}

/// Every action's place in `at`; a send or receive posted twice is refused.
fn place(
    devices: &[Vec<Action>],
    cells: &[Vec<(usize, usize)>],
    mut at: Positions,
) -> Result<Positions, CsvError> {
    for (d, row) in devices.iter().enumerate() {
        for (i, a) in row.iter().enumerate() {
            if a.kind.is_comm() && at.get(*a).is_some() {
                return Err(handoff_error(
                    cells,
                    (d, i),
                    format!("`{a}` is posted twice (PyTorch would pair the second with another message)"),
                ));
            }
            for p in a.parts() {
                at.put(p, (d, i));
            }
        }
    }
    Ok(at)
}

/// Each hand-off between two devices has its send after its maker in the maker's row and its
/// receive before its user in the user's row; the ones found are marked needed in `at`.
fn check_pairs(
    devices: &[Vec<Action>],
    cells: &[Vec<(usize, usize)>],
    stage_device: &[u32],
    at: &mut Positions,
) -> Result<(), CsvError> {
    let stages = stage_device.len() as u32;
    for (d, row) in devices.iter().enumerate() {
        for (i, a) in row.iter().enumerate() {
            for p in a.parts() {
                let (s, mb) = (p.stage, p.microbatch);
                let (send, recv, to, users) = match p.kind {
                    ActionKind::F if s + 1 < stages => (
                        ActionKind::SendF,
                        ActionKind::RecvF,
                        s + 1,
                        [ActionKind::F; 2],
                    ),
                    ActionKind::B | ActionKind::I if s > 0 => (
                        ActionKind::SendB,
                        ActionKind::RecvB,
                        s - 1,
                        [ActionKind::B, ActionKind::I],
                    ),
                    _ => continue,
                };
                let to_device = stage_device[to as usize];
                if to_device as usize == d {
                    continue;
                }
                let send = Action::new(s, send, mb);
                if !matches!(at.get(send), Some((sd, si)) if sd == d && si > i) {
                    return Err(handoff_error(cells, (d, i), format!(
                        "`{p}` hands its output to device {to_device}, but no `{send}` follows it in its row (the receiver would wait for it for ever)"
                    )));
                }
                let recv = Action::new(to, recv, mb);
                let user = users
                    .iter()
                    .find_map(|&k| at.get(Action::new(to, k, mb)).map(|w| (k, w)));
                if let Some((kind, (ud, ui))) = user {
                    if !matches!(at.get(recv), Some((rd, ri)) if rd == ud && ri < ui) {
                        let user = Action::new(to, kind, mb);
                        return Err(handoff_error(cells, (ud, ui), format!(
                            "`{user}` uses what `{p}` sends, but no `{recv}` comes before it in its row (PyTorch's runtime refuses to compute before receiving)"
                        )));
                    }
                }
                at.need(send);
                at.need(recv);
            }
        }
    }
    Ok(())
}

/// No send or receive that no hand-off needs.
fn check_needed(
    devices: &[Vec<Action>],
    cells: &[Vec<(usize, usize)>],
    stages: u32,
    at: &Positions,
) -> Result<(), CsvError> {
    for (d, row) in devices.iter().enumerate() {
        for (i, a) in row.iter().enumerate() {
            if a.kind.is_comm() && !at.needed(*a) {
                let why = match a.kind {
                    ActionKind::SendF | ActionKind::RecvB if a.stage + 1 >= stages => {
                        format!("stage {} is the last", a.stage)
                    }
                    ActionKind::SendB | ActionKind::RecvF if a.stage == 0 => {
                        "stage 0 is the first".to_string()
                    }
                    _ => "no action of its row or its peer's makes or uses it there".to_string(),
                };
                return Err(handoff_error(cells, (d, i), format!(
                    "`{a}` is no hand-off of this timetable ({why}; PyTorch would wait for it for ever)"
                )));
            }
        }
    }
    Ok(())
}

/// Where the first of each simple action and hand-off is (device, index in its row), and
/// which hand-offs the compute needs, by (stage, microbatch, kind): a dense table, as the
/// writer's (hashing every cell made reading 2.6 times slower). Sized by a complete
/// timetable's stages times microbatches, which its forwards bound.
struct Positions {
    at: Vec<u64>,
    needed: Vec<bool>,
    stages: u32,
    microbatches: u32,
}

impl Positions {
    const KINDS: usize = 7;

    fn new(stages: u32, microbatches: u32) -> Self {
        let n = stages as usize * microbatches as usize * Self::KINDS;
        Positions {
            at: vec![u64::MAX; n],
            needed: vec![false; n],
            stages,
            microbatches,
        }
    }

    fn slot(&self, a: Action) -> Option<usize> {
        let kind = match a.kind {
            ActionKind::F => 0,
            ActionKind::B => 1,
            ActionKind::I => 2,
            ActionKind::SendF => 3,
            ActionKind::RecvF => 4,
            ActionKind::SendB => 5,
            ActionKind::RecvB => 6,
            _ => return None,
        };
        (a.stage < self.stages && a.microbatch < self.microbatches).then(|| {
            (a.stage as usize * self.microbatches as usize + a.microbatch as usize) * Self::KINDS
                + kind
        })
    }

    /// Record where `a` is, unless an earlier one is recorded.
    fn put(&mut self, a: Action, (d, i): (usize, usize)) {
        if let Some(k) = self.slot(a) {
            if self.at[k] == u64::MAX {
                self.at[k] = (d as u64) << 32 | i as u64;
            }
        }
    }

    fn get(&self, a: Action) -> Option<(usize, usize)> {
        let v = self.at[self.slot(a)?];
        (v != u64::MAX).then_some(((v >> 32) as usize, (v & u64::from(u32::MAX)) as usize))
    }

    fn need(&mut self, a: Action) {
        if let Some(k) = self.slot(a) {
            self.needed[k] = true;
        }
    }

    fn needed(&self, a: Action) -> bool {
        self.slot(a).is_some_and(|k| self.needed[k])
    }
}

/// One row's gradient reduction started and not yet waited for, as PyTorch checks them when
/// it loads a compute+comms file: each `REDUCE_GRAD` followed by its stage's
/// `WAIT_REDUCE_GRAD`, at most one pending at a time.
#[derive(Default)]
pub(super) struct Reductions {
    pending: Option<(u32, String, (usize, usize))>,
}

impl Reductions {
    pub(super) fn see(
        &mut self,
        (name, stage): (&str, u32),
        token: &str,
        (line, column): (usize, usize),
    ) -> Result<(), CsvError> {
        let refuse = |message: String| CsvError::Reduction {
            line,
            column,
            message,
        };
        match (name, &self.pending) {
            ("REDUCE_GRAD", Some((pending, _, _))) => Err(refuse(format!(
                "`{token}` while stage {pending}'s reduction is pending: PyTorch keeps at most one pending a rank (wait for it first)"
            ))),
            ("REDUCE_GRAD", None) => {
                self.pending = Some((stage, token.to_string(), (line, column)));
                Ok(())
            }
            ("WAIT_REDUCE_GRAD", None) => Err(refuse(format!(
                "`{token}` waits for a reduction its row has not started (PyTorch refuses it)"
            ))),
            ("WAIT_REDUCE_GRAD", Some((pending, _, _))) if *pending != stage => {
                Err(refuse(format!(
                    "`{token}`, but stage {pending}'s reduction is the one pending (PyTorch refuses it)"
                )))
            }
            ("WAIT_REDUCE_GRAD", Some(_)) => {
                self.pending = None;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// At the end of a row: no reduction left without its wait.
    pub(super) fn end(self) -> Result<(), CsvError> {
        match self.pending {
            Some((_, token, (line, column))) => Err(CsvError::Reduction {
                line,
                column,
                message: format!(
                    "`{token}` has no WAIT_REDUCE_GRAD after it in its row (PyTorch refuses it)"
                ),
            }),
            None => Ok(()),
        }
    }
}

/// One row's sends and whether each has been waited for, in the order sent.
#[derive(Default)]
pub(super) struct Sends {
    order: Vec<(Action, (usize, usize), bool)>,
    at: HashMap<Action, usize>,
}

impl Sends {
    pub(super) fn send(&mut self, a: Action, place: (usize, usize)) {
        self.at.insert(a, self.order.len());
        self.order.push((a, place, false));
    }

    /// Mark the send `a` waited for; false when there is no such send pending.
    pub(super) fn wait(&mut self, a: Action) -> bool {
        match self.at.remove(&a) {
            Some(i) => {
                self.order[i].2 = true;
                true
            }
            None => false,
        }
    }

    pub(super) fn first_unwaited(&self) -> Option<(Action, (usize, usize))> {
        self.order
            .iter()
            .find(|(_, _, waited)| !waited)
            .map(|&(a, place, _)| (a, place))
    }
}
