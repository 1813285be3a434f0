//! PyTorch's two CSV forms of a timetable, written exactly as `torch.distributed.pipelining`
//! reads them:
//!
//! - **compute-only**: one row per rank of `F`, `B`, `I`, `W` and `(F;B)OVERLAP_F_B` cells,
//!   what `_PipelineScheduleRuntime._load_csv(path)` and torchtitan's schedule CSV read;
//! - **compute+comms**: what `_load_csv(path, format="compute_comms")` reads, the same rows as
//!   PyTorch's own lowering of the compute-only form at its defaults (`max_active_stages=3`,
//!   receives not deferred, no send budget): `UNSHARD`/`RESHARD` around each stage's work
//!   (no-ops without FSDP), `REDUCE_GRAD` and `WAIT_REDUCE_GRAD` after a stage's last
//!   backward (they scale its gradients by 1/m), `SEND_*`/`RECV_*`, and a `WAIT_SEND_*` for
//!   every send.
//!
//! The second form is PyTorch's lowering (`_add_unshard_reshard`, `_add_reduce_grad`,
//! `_add_send_recv`, `_add_wait_send` in `schedules.py`), not pipewright's [`lower`]: its
//! receives are posted as soon as their sender sends, so that the order of messages between
//! two ranks is the same on both sides, which PyTorch's untagged point-to-point needs.
//! pipewright's own lowered rows (a receive right before its use, no waits) are a third form
//! that only pipewright reads.
//!
//! What PyTorch cannot express is refused in one line: recomputation (`R`) and a rank with
//! no work.
//!
//! [`lower`]: crate::lower

use std::collections::HashMap;
use std::fmt;

use crate::action::{Action, ActionKind};
use crate::timetable::Timetable;

pub use super::form::CsvForm;

/// Why a timetable has no PyTorch form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PytorchError {
    /// Recompute actions: PyTorch's pipelining has no such action.
    #[error("{count} recompute action{s} ({examples}) on stage{ss} {stages}: PyTorch's pipelining has no recompute action; write the timetable without recomputation and wrap those stages' modules in activation checkpointing (torch.utils.checkpoint) in PyTorch, or write a .json timetable for pipewright's own runtime", s = plural(*count), ss = plural(stages.split(',').count()))]
    Recompute {
        /// How many `R` actions.
        count: usize,
        /// The first few, as text.
        examples: String,
        /// The stages they recompute, comma separated.
        stages: String,
    },
    /// A device with no action: PyTorch needs work on every rank.
    #[error("device {device} has no action: PyTorch's runtime needs one row of work per rank (give every device a stage)")]
    IdleDevice {
        /// The device.
        device: u32,
    },
    /// PyTorch's lowering found no rank able to go on (the timetable would deadlock).
    #[error("PyTorch's lowering cannot place the sends and receives: every rank waits (device {device} at {action}); validate the timetable first")]
    Stuck {
        /// A waiting device.
        device: u32,
        /// What it waits to run.
        action: Action,
    },
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Write `tt` as CSV in `form`. PyTorch's forms take the compute order (any sends and
/// receives of a lowered timetable are left out, and PyTorch's own are placed for
/// compute+comms); the lowered form writes the rows as they are.
pub fn write_csv(tt: &Timetable, form: CsvForm) -> Result<String, PytorchError> {
    if form == CsvForm::Lowered {
        return Ok(super::csv::to_csv(tt));
    }
    let compute = pytorch_compute(tt)?;
    match form {
        CsvForm::ComputeOnly => Ok(super::csv::to_csv(&compute)),
        _ => Ok(rows_text(&compute_comms(&compute)?)),
    }
}

/// The compute-only timetable PyTorch can run, or why there is none.
fn pytorch_compute(tt: &Timetable) -> Result<Timetable, PytorchError> {
    let compute = tt.compute_only();
    let recomputes: Vec<Action> = compute
        .devices
        .iter()
        .flatten()
        .copied()
        .filter(|a| a.kind == ActionKind::R)
        .collect();
    if !recomputes.is_empty() {
        let mut stages: Vec<u32> = recomputes.iter().map(|a| a.stage).collect();
        stages.sort_unstable();
        stages.dedup();
        let examples: Vec<String> = recomputes.iter().take(3).map(Action::to_string).collect();
        let more = if recomputes.len() > 3 { ", ..." } else { "" };
        return Err(PytorchError::Recompute {
            count: recomputes.len(),
            examples: format!("{}{more}", examples.join(", ")),
            stages: stages
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        });
    }
    if let Some(d) = compute.devices.iter().position(Vec::is_empty) {
        return Err(PytorchError::IdleDevice { device: d as u32 });
    }
    Ok(compute)
}

/// One cell of PyTorch's compute+comms form: a pipewright action or one PyTorch adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A compute action, a send or a receive.
    Act(Action),
    /// FSDP all-gather of a stage's parameters (`0UNSHARD`; a no-op without FSDP).
    Unshard(u32),
    /// FSDP release of a stage's parameters (`0RESHARD`).
    Reshard(u32),
    /// Gradient reduction and 1/m scaling after a stage's last backward (`0REDUCE_GRAD`).
    ReduceGrad(u32),
    /// Its wait (`0WAIT_REDUCE_GRAD`).
    WaitReduceGrad(u32),
    /// Wait for a forward send (stage, microbatch): `0WAIT_SEND_F3`.
    WaitSendF(u32, u32),
    /// Wait for a backward send: `1WAIT_SEND_B3`.
    WaitSendB(u32, u32),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Act(a) => a.fmt(f),
            Op::Unshard(s) => write!(f, "{s}UNSHARD"),
            Op::Reshard(s) => write!(f, "{s}RESHARD"),
            Op::ReduceGrad(s) => write!(f, "{s}REDUCE_GRAD"),
            Op::WaitReduceGrad(s) => write!(f, "{s}WAIT_REDUCE_GRAD"),
            Op::WaitSendF(s, m) => write!(f, "{s}WAIT_SEND_F{m}"),
            Op::WaitSendB(s, m) => write!(f, "{s}WAIT_SEND_B{m}"),
        }
    }
}

/// PyTorch's default `max_active_stages` (and, with `unshard_lookahead="full"`, lookahead).
const MAX_ACTIVE_STAGES: usize = 3;

/// PyTorch's lowering of a compute-only timetable at its defaults: one row of [`Op`]s per
/// rank, in the order `_prepare_schedule_with_comms` makes them.
pub fn compute_comms(tt: &Timetable) -> Result<Vec<Vec<Op>>, PytorchError> {
    let rows: Vec<Vec<Op>> = tt
        .devices
        .iter()
        .map(|row| reduce_grad(&unshard_reshard(row), tt.microbatches))
        .collect();
    let rows: Vec<&[Op]> = rows.iter().map(Vec::as_slice).collect();
    Ok(send_recv(tt, rows)?.into_iter().map(wait_send).collect())
}

fn rows_text(rows: &[Vec<Op>]) -> String {
    use fmt::Write as _;
    let mut out = String::new();
    for row in rows {
        for (i, op) in row.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{op}");
        }
        out.push('\n');
    }
    out
}

/// `_add_unshard_reshard`: before each action, release the stages that are not among the
/// next `MAX_ACTIVE_STAGES` distinct stages to compute, and fetch those that are.
fn unshard_reshard(row: &[Action]) -> Vec<Op> {
    let ahead = next_stages(row, MAX_ACTIVE_STAGES);
    let mut active: Vec<u32> = Vec::new();
    let mut out = Vec::with_capacity(row.len() + 8);
    for (&a, resident) in row.iter().zip(&ahead) {
        let (evict, keep): (Vec<u32>, Vec<u32>) =
            active.iter().partition(|s| !resident.contains(s));
        out.extend(evict.into_iter().map(Op::Reshard));
        active = keep;
        for &s in resident {
            if !active.contains(&s) {
                active.push(s);
                out.push(Op::Unshard(s));
            }
        }
        out.push(Op::Act(a));
    }
    out.extend(active.into_iter().map(Op::Reshard));
    out
}

/// For each position of `row`, PyTorch's `next_stage_indices(count, row[i:])`: the distinct
/// stages in the order they are next computed, whole actions at a time, stopping once
/// `count` are found. Computed backwards from each stage's next use, so a row costs
/// O(len x stages on the device) rather than a scan to its end per action.
fn next_stages(row: &[Action], count: usize) -> Vec<Vec<u32>> {
    let mut next: HashMap<u32, (usize, usize)> = HashMap::new();
    let mut out = vec![Vec::new(); row.len()];
    for (i, a) in row.iter().enumerate().rev() {
        // Later parts first, so an overlap's F wins a tie with its own B's stage.
        let parts: Vec<Action> = a.parts().collect();
        for (j, p) in parts.iter().enumerate().rev() {
            next.insert(p.stage, (i, j));
        }
        let mut order: Vec<(usize, usize, u32)> =
            next.iter().map(|(&s, &(i, j))| (i, j, s)).collect();
        order.sort_unstable();
        let mut found = Vec::new();
        let mut k = 0;
        while k < order.len() && found.len() < count {
            let at = order[k].0;
            while k < order.len() && order[k].0 == at {
                found.push(order[k].2);
                k += 1;
            }
        }
        out[i] = found;
    }
    out
}

/// `_add_reduce_grad`: after the action that completes a stage's m-th backward (B or W),
/// reduce its gradients and wait for it.
fn reduce_grad(row: &[Op], microbatches: u32) -> Vec<Op> {
    let mut count: HashMap<u32, u32> = HashMap::new();
    let mut out = Vec::with_capacity(row.len() + 8);
    for &op in row {
        out.push(op);
        let Op::Act(a) = op else { continue };
        for p in a.parts() {
            if !matches!(p.kind, ActionKind::B | ActionKind::W) {
                continue;
            }
            let n = count.entry(p.stage).or_insert(0);
            *n += 1;
            if *n == microbatches {
                out.push(Op::ReduceGrad(p.stage));
                out.push(Op::WaitReduceGrad(p.stage));
            }
        }
    }
    out
}

/// A send as a key (stage, kind, microbatch).
type Key = (u32, ActionKind, u32);

fn key(a: Action) -> Key {
    (a.stage, a.kind, a.microbatch)
}

/// Which simple actions and receives have been placed, one bit per kind for each (stage,
/// microbatch): an action of a stage only ever runs on that stage's rank, so one table
/// serves every rank (a dense table, not a hash set: this is most of the writer's work).
struct Placed {
    bits: Vec<u16>,
    microbatches: usize,
}

impl Placed {
    fn new(tt: &Timetable) -> Self {
        let microbatches = tt.microbatches as usize;
        Placed {
            bits: vec![0; tt.stage_device.len() * microbatches],
            microbatches,
        }
    }

    fn slot(&self, s: u32, mb: u32) -> Option<usize> {
        let i = s as usize * self.microbatches + mb as usize;
        (i < self.bits.len() && (mb as usize) < self.microbatches).then_some(i)
    }

    fn insert(&mut self, a: Action) {
        if let Some(i) = self.slot(a.stage, a.microbatch) {
            self.bits[i] |= 1 << a.kind.index();
        }
    }

    fn has(&self, s: u32, kind: ActionKind, mb: u32) -> bool {
        self.slot(s, mb)
            .is_some_and(|i| self.bits[i] & (1 << kind.index()) != 0)
    }
}

/// `_add_send_recv`: ranks take turns in order; a rank places its next action when its
/// inputs are there (received, or made on this rank), then the send of its output, and the
/// matching receive goes at the end of the receiving rank's row at that moment.
fn send_recv(tt: &Timetable, rows: Vec<&[Op]>) -> Result<Vec<Vec<Op>>, PytorchError> {
    let stages = tt.num_stages();
    let dev = |s: u32| tt.stage_device[s as usize];
    let mut out: Vec<Vec<Op>> = rows
        .iter()
        .map(|r| Vec::with_capacity(r.len() * 2))
        .collect();
    let mut seen = Placed::new(tt);
    let mut next = vec![0usize; rows.len()];
    let mut live: Vec<usize> = (0..rows.len()).filter(|&d| !rows[d].is_empty()).collect();
    // The send an action's part needs, and the receive that pairs with it.
    let comms = |p: Action, d: usize| -> Option<(Action, Action)> {
        let (s, mb) = (p.stage, p.microbatch);
        match p.kind {
            ActionKind::F if s + 1 < stages && dev(s + 1) as usize != d => Some((
                Action::new(s, ActionKind::SendF, mb),
                Action::new(s + 1, ActionKind::RecvF, mb),
            )),
            ActionKind::B | ActionKind::I if s > 0 && dev(s - 1) as usize != d => Some((
                Action::new(s, ActionKind::SendB, mb),
                Action::new(s - 1, ActionKind::RecvB, mb),
            )),
            _ => None,
        }
    };
    while !live.is_empty() {
        let mut progress = false;
        for &d in &live {
            let op = rows[d][next[d]];
            if let Op::Act(a) = op {
                if !a
                    .parts()
                    .all(|p| ready(p, &seen, stages, |s| dev(s) as usize == d))
                {
                    continue;
                }
                out[d].push(op);
                for p in a.parts() {
                    seen.insert(p);
                    if let Some((send, recv)) = comms(p, d) {
                        out[d].push(Op::Act(send));
                        seen.insert(send);
                        let to = dev(recv.stage) as usize;
                        out[to].push(Op::Act(recv));
                        seen.insert(recv);
                    }
                }
            } else {
                out[d].push(op);
            }
            next[d] += 1;
            progress = true;
        }
        if !progress {
            // Every live rank waits, and only an action can (the ops PyTorch adds never do).
            let (d, action) = live
                .iter()
                .find_map(|&d| match rows[d][next[d]] {
                    Op::Act(a) => Some((d, a)),
                    _ => None,
                })
                .unwrap_or((live[0], Action::new(0, ActionKind::F, 0)));
            return Err(PytorchError::Stuck {
                device: d as u32,
                action,
            });
        }
        live.retain(|&d| next[d] < rows[d].len());
    }
    Ok(out)
}

/// `_ready_to_schedule`: a forward needs its input received or made here (`here` says
/// whether a stage is on this rank); a backward its output gradient; everything else is
/// ready.
fn ready(p: Action, seen: &Placed, stages: u32, here: impl Fn(u32) -> bool) -> bool {
    use ActionKind::{RecvB, RecvF, B, F, I};
    let (s, mb) = (p.stage, p.microbatch);
    match p.kind {
        F if s != 0 => seen.has(s, RecvF, mb) || (here(s - 1) && seen.has(s - 1, F, mb)),
        B | I if s + 1 != stages => {
            seen.has(s, RecvB, mb)
                || (here(s + 1) && (seen.has(s + 1, I, mb) || seen.has(s + 1, B, mb)))
        }
        _ => true,
    }
}

/// `_add_wait_send`: a forward send waits right after this rank's backward of the same
/// stage and microbatch (by then the receiver has used it); every other send waits at the
/// end of the row, in the order sent.
fn wait_send(row: Vec<Op>) -> Vec<Op> {
    let mut out = Vec::with_capacity(row.len() * 3 / 2);
    // Pending sends in the order sent; a waited one becomes None.
    let mut pending: Vec<Option<Key>> = Vec::new();
    let mut at: HashMap<Key, usize> = HashMap::new();
    for op in row {
        out.push(op);
        let Op::Act(a) = op else { continue };
        if matches!(a.kind, ActionKind::SendF | ActionKind::SendB) {
            at.insert(key(a), pending.len());
            pending.push(Some(key(a)));
        }
        for p in a.parts() {
            if !p.kind.is_input_backward() {
                continue;
            }
            if let Some(i) = at.remove(&(p.stage, ActionKind::SendF, p.microbatch)) {
                pending[i] = None;
                out.push(Op::WaitSendF(p.stage, p.microbatch));
            }
        }
    }
    out.extend(pending.into_iter().flatten().map(|(s, kind, mb)| {
        if kind == ActionKind::SendF {
            Op::WaitSendF(s, mb)
        } else {
            Op::WaitSendB(s, mb)
        }
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{from_csv, generate, lower, recompute, RecomputePlan, ScheduleKind, ScheduleSpec};
    use std::collections::HashSet;

    fn one_f_one_b() -> Timetable {
        generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 2, None).unwrap())
    }

    #[test]
    fn compute_only_is_the_compute_rows() {
        let tt = one_f_one_b();
        let text = write_csv(&tt, CsvForm::ComputeOnly).unwrap();
        assert_eq!(text, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
        // A lowered timetable writes the same compute-only rows.
        let lowered = lower(&tt).unwrap();
        assert_eq!(write_csv(&lowered, CsvForm::ComputeOnly).unwrap(), text);
    }

    #[test]
    fn compute_comms_is_pytorchs_own_lowering_to_the_cell() {
        // What PyTorch 2.15's `_load_csv` then `_dump_csv(format="compute_comms")` writes
        // for the compute-only rows above.
        let want = "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,\
                    0WAIT_SEND_F1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n\
                    1UNSHARD,1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD,\
                    1WAIT_REDUCE_GRAD,1RESHARD,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
        let tt = one_f_one_b();
        assert_eq!(write_csv(&tt, CsvForm::ComputeComms).unwrap(), want);
        let lowered = lower(&tt).unwrap();
        assert_eq!(write_csv(&lowered, CsvForm::ComputeComms).unwrap(), want);
    }

    #[test]
    fn both_forms_read_back_to_the_compute_order() {
        for kind in ScheduleKind::ALL {
            let v = kind
                .fixed_virtual()
                .unwrap_or(if kind.supports_virtual() { 2 } else { 1 });
            let p = if v > 1 { 2 } else { 4 };
            let Ok(spec) = ScheduleSpec::new(kind, p, v, 8, None) else {
                continue;
            };
            let tt = generate(&spec);
            for form in [CsvForm::ComputeOnly, CsvForm::ComputeComms] {
                let text = write_csv(&tt, form).unwrap();
                let (back, src) = from_csv(&text).unwrap();
                assert_eq!(src.form(), form, "{kind:?}");
                assert_eq!(back.devices, tt.devices, "{kind:?} {form:?}");
                assert_eq!(back.stage_device, tt.stage_device, "{kind:?} {form:?}");
                // And writes the same text again.
                assert_eq!(write_csv(&back, form).unwrap(), text, "{kind:?} {form:?}");
            }
            let lowered = lower(&tt).unwrap();
            let (back, src) = from_csv(&write_csv(&lowered, CsvForm::Lowered).unwrap()).unwrap();
            assert_eq!(
                (src.form(), back.devices),
                (CsvForm::Lowered, lowered.devices)
            );
        }
    }

    #[test]
    fn every_send_waits_once_after_it() {
        let spec = ScheduleSpec::new(ScheduleKind::Zbv, 4, 2, 8, None).unwrap();
        for row in compute_comms(&generate(&spec)).unwrap() {
            let mut pending = HashSet::new();
            for op in row {
                match op {
                    Op::Act(a) if matches!(a.kind, ActionKind::SendF | ActionKind::SendB) => {
                        assert!(pending.insert((
                            a.kind == ActionKind::SendF,
                            a.stage,
                            a.microbatch
                        )));
                    }
                    Op::WaitSendF(s, m) => assert!(pending.remove(&(true, s, m)), "{op}"),
                    Op::WaitSendB(s, m) => assert!(pending.remove(&(false, s, m)), "{op}"),
                    _ => {}
                }
            }
            assert!(pending.is_empty());
        }
    }

    #[test]
    fn recompute_is_refused_naming_the_actions_and_what_to_do() {
        let tt = recompute::insert(&one_f_one_b(), &"1:full".parse::<RecomputePlan>().unwrap());
        for form in [CsvForm::ComputeOnly, CsvForm::ComputeComms] {
            let err = write_csv(&tt, form).unwrap_err().to_string();
            assert!(
                err.starts_with("2 recompute actions (1R0, 1R1) on stage 1: PyTorch's pipelining has no recompute action")
                    && err.contains("activation checkpointing")
                    && err.contains(".json timetable"),
                "{err}"
            );
        }
        // pipewright's own form keeps them.
        assert!(write_csv(&tt, CsvForm::Lowered).unwrap().contains("1R0"));
    }

    #[test]
    fn a_device_with_no_work_is_refused() {
        let mut tt = one_f_one_b();
        tt.devices.push(Vec::new());
        let err = write_csv(&tt, CsvForm::ComputeOnly).unwrap_err();
        assert_eq!(err, PytorchError::IdleDevice { device: 2 });
    }
}
