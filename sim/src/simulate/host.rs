//! Host time: what a runtime spends on a device's one thread besides computing, measured, and
//! charged by the simulator where that runtime spends it.
//!
//! A Python runtime (PyTorch's `_PipelineScheduleRuntime`) walks one row of actions per rank on
//! one thread: it takes each action (bookkeeping before the compute starts), posts each send
//! and each receive (`batch_isend_irecv`), and runs ops of its own (`UNSHARD`, `RESHARD`,
//! `REDUCE_GRAD`, `WAIT_SEND_*`). None of that is compute, and all of it delays the next
//! compute on that rank. An interleaved schedule has twice the hand-offs of 1F1B and pays
//! twice the posting: this is what made it slower with no extra compute.
//!
//! With [`HostCosts`] in the cost model the simulator:
//! - lowers the timetable the way the named [`Runtime`] does (PyTorch's receives are posted as
//!   soon as their sender sends, not right before their use, and its own ops sit between);
//! - charges `action` before each compute (overlapping a wait for data: the host work is done
//!   while the data travels), `send` and `recv` for posting each message on the compute
//!   thread, and `other` for each of the runtime's own ops;
//! - starts a hand-off's transfer when its send is posted, so `p2p_latency` is the time in
//!   transit (from the posting's end to the consumer's compute start).

use serde::{Deserialize, Serialize};

use pipewright_schedule::action::Action;
use pipewright_schedule::formats::pytorch::{compute_comms, Op, PytorchError};
use pipewright_schedule::timetable::{lower, LowerError, Timetable};

/// The runtime whose placement of sends, receives and its own ops a cost model describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// pipewright's own: a receive right before its use, a send right after its producer.
    #[default]
    Pipewright,
    /// PyTorch's `_PipelineScheduleRuntime` at its defaults (`pipewright.torch`, torchtitan).
    Pytorch,
}

/// Host time per action and per message on a device's compute thread, in the costs' unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCosts {
    /// Whose runtime: where its sends, receives and own ops sit in each row.
    #[serde(default)]
    pub runtime: Runtime,
    /// Before each compute action's compute: taking the action, finding its input.
    #[serde(default)]
    pub action: f64,
    /// Posting one send.
    #[serde(default)]
    pub send: f64,
    /// Posting one receive.
    #[serde(default)]
    pub recv: f64,
    /// Each op of the runtime's own (PyTorch: UNSHARD, RESHARD, REDUCE_GRAD; not its waits).
    #[serde(default)]
    pub other: f64,
    /// The fixed part of each compute action of a kind: what its stage's `f`, `b`, `i` or `w`
    /// holds besides the model's own work (the runtime's bookkeeping around the module's
    /// forward or autograd's backward, a last stage's loss). A model cut into more stages pays
    /// it once per action, not a share of it: see [`CostModel::resample`](super::CostModel::resample).
    #[serde(default, skip_serializing_if = "CallCosts::is_zero")]
    pub call: CallCosts,
}

/// The fixed time of one compute action of each kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallCosts {
    /// Of a forward.
    #[serde(default)]
    pub f: f64,
    /// Of a full backward.
    #[serde(default)]
    pub b: f64,
    /// Of an input-gradient backward.
    #[serde(default)]
    pub i: f64,
    /// Of a weight-gradient backward.
    #[serde(default)]
    pub w: f64,
}

impl CallCosts {
    fn is_zero(&self) -> bool {
        *self == CallCosts::default()
    }
}

impl HostCosts {
    /// Each time by name, for checks and messages.
    pub fn times(&self) -> [(&'static str, f64); 8] {
        [
            ("host.action", self.action),
            ("host.send", self.send),
            ("host.recv", self.recv),
            ("host.other", self.other),
            ("host.call.f", self.call.f),
            ("host.call.b", self.call.b),
            ("host.call.i", self.call.i),
            ("host.call.w", self.call.w),
        ]
    }
}

/// Why a timetable cannot be lowered the way a runtime does it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HostError {
    /// pipewright's lowering failed.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// PyTorch cannot run the timetable.
    #[error("the cost model is PyTorch's runtime's, but {0}")]
    Pytorch(#[from] PytorchError),
}

/// The host time of a timetable lowered as a runtime runs it: the runtime's own ops that come
/// before each action, and the costs per action and message.
pub(super) struct HostPlan {
    /// `before[d][i]`: host time of the runtime's own ops right before action `i` of device
    /// `d`'s row; `before[d][len]`: after its last action (charged before the next step).
    pub before: Vec<Vec<f64>>,
    /// The costs.
    pub costs: HostCosts,
}

impl HostPlan {
    /// Lower `tt` (compute actions; any sends and receives it has are placed again) as
    /// `host.runtime` runs it: the lowered rows, in the runtime's order, and their host time.
    pub fn new(tt: &Timetable, host: HostCosts) -> Result<(Timetable, Self), HostError> {
        let compute = tt.compute_only();
        let (lowered, before) = match host.runtime {
            Runtime::Pipewright => {
                let lowered = lower(&compute)?;
                let before = lowered
                    .devices
                    .iter()
                    .map(|r| vec![0.0; r.len() + 1])
                    .collect();
                (lowered, before)
            }
            Runtime::Pytorch => {
                let rows = compute_comms(&compute)?;
                let mut devices = Vec::with_capacity(rows.len());
                let mut before = Vec::with_capacity(rows.len());
                for row in rows {
                    let (actions, own) = split_row(&row, host.other);
                    devices.push(actions);
                    before.push(own);
                }
                let lowered = Timetable { devices, ..compute };
                (lowered, before)
            }
        };
        Ok((
            lowered,
            HostPlan {
                before,
                costs: host,
            },
        ))
    }

    /// Host time of the runtime's own ops before action `pc` of device `d`'s row, where `pc`
    /// counts on through repeated steps: at the start of a later step, the previous step's
    /// trailing ops come first.
    pub fn before(&self, d: usize, pc: usize) -> f64 {
        let row = &self.before[d];
        let len = row.len() - 1;
        if len == 0 {
            return 0.0;
        }
        let i = pc % len;
        let trailing = if i == 0 && pc > 0 { row[len] } else { 0.0 };
        row[i] + trailing
    }
}

/// A PyTorch row's actions, and the host time of its own ops before each (and after the
/// last). Its waits (`WAIT_SEND_*`, `WAIT_REDUCE_GRAD`) are not host work but a peer's or the
/// transport's time, which the hand-offs already carry: they are not charged.
fn split_row(row: &[Op], other: f64) -> (Vec<Action>, Vec<f64>) {
    let mut actions = Vec::with_capacity(row.len());
    let mut before = Vec::with_capacity(row.len() + 1);
    let mut pending = 0u32;
    for op in row {
        match op {
            Op::Act(a) => {
                actions.push(*a);
                before.push(f64::from(pending) * other);
                pending = 0;
            }
            Op::Unshard(_) | Op::Reshard(_) | Op::ReduceGrad(_) => pending += 1,
            Op::WaitReduceGrad(_) | Op::WaitSendF(..) | Op::WaitSendB(..) => {}
        }
    }
    before.push(f64::from(pending) * other);
    (actions, before)
}
