//! Costs: how long each stage's F, B, I and W take, how big its activations and hand-offs are,
//! and how fast the links between devices move them.

use serde::{Deserialize, Serialize};

mod error;
mod raw;

pub use error::{CostError, Place};
pub use raw::{RawCostFile, RawStageCost};

use super::host::{CallCosts, HostCosts};
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::formats::without_position;

/// Costs of one stage (model chunk) on one microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward time.
    pub f: f64,
    /// Full backward time.
    pub b: f64,
    /// Input-gradient backward time.
    pub i: f64,
    /// Weight-gradient backward time.
    pub w: f64,
    /// Time of the communication inside this stage's forward that is not a pipeline
    /// hand-off: expert parallelism's all-to-all, dispatch and combine, of every MoE layer in
    /// the stage. `f`, `b`, `i` and `w` are computation only; a forward on its own pays
    /// `f + f_comm`, a recompute (`R`) repeats it, and an F&B overlap hides it behind the
    /// other microbatch's computation (see [`overlap_time`]). 0 (the default) for dense.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub f_comm: f64,
    /// The same in the backward (the all-to-all of the gradients): a full backward `B` pays
    /// `b + b_comm`, and so does the input part `I` of a split one (`i + b_comm`); the weight
    /// part `W` communicates nothing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub b_comm: f64,
    /// Bytes of activations stashed from F until the backward is done.
    pub activation_bytes: u64,
    /// Fraction of the stashed activations still held after the input backward (I) until the
    /// weight backward (W) ends; the rest is freed when I ends. 1 (the default) holds all of
    /// them until W. The zero-bubble paper's transformer layer keeps `M_W / M_B` =
    /// `32h / (34h + 5as)` (hidden size h, heads a, sequence s): about 0.37 to 0.43.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub w_memory: f64,
    /// Bytes of the stage's output (and of its gradient) sent to the next stage.
    pub p2p_bytes: u64,
    /// Time of this stage's hand-off to its neighbour, overriding the link model's
    /// `latency + p2p_bytes / bandwidth` (a planner that knows which hand-offs cross nodes
    /// sets it per stage); `None` for the link model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_time: Option<f64>,
    /// Time of DualPipe's F&B overlap whose forward is this stage's, as measured: it wins over
    /// the closed form; `None` for [`overlap_time`] of this stage's F and the backward
    /// stage's B (with no `f_comm`/`b_comm`, the sum of `f` and `b`: nothing to hide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<f64>,
    /// Time of the stage's optimizer step, once per training step after its last backward
    /// (only multi-step simulations see it: it delays the device's next step).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub optimizer: f64,
    /// Time of the data-parallel all-reduce of the stage's gradients, started after its last
    /// backward of a step and awaited before the device's optimizer step (multi-step only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dp_allreduce: f64,
    /// Time of a recompute (`R`) of this stage; `None` for the forward's time `f` (full
    /// recomputation reruns the forward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r: Option<f64>,
    /// Communication inside a recompute; `None` for the forward's `f_comm` (a full recompute
    /// reruns the all-to-all). A selective recompute that reruns no dispatch has 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_comm: Option<f64>,
    /// Bytes a recomputed microbatch keeps from its F until its R (full recomputation: the
    /// stage's input); `None` for the hand-off into the stage, the previous stage's
    /// `p2p_bytes` (0 on the first stage, whose input is token ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_bytes: Option<u64>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl Default for StageCost {
    /// All zero: no time, no bytes; `w_memory` 1 and every override `None`, as a cost file
    /// that gives only zeros. For literals: `StageCost { f, b, ..Default::default() }`.
    fn default() -> Self {
        StageCost {
            f: 0.0,
            b: 0.0,
            i: 0.0,
            w: 0.0,
            f_comm: 0.0,
            b_comm: 0.0,
            activation_bytes: 0,
            w_memory: 1.0,
            p2p_bytes: 0,
            p2p_time: None,
            overlap: None,
            optimizer: 0.0,
            dp_allreduce: 0.0,
            r: None,
            r_comm: None,
            kept_bytes: None,
        }
    }
}

impl StageCost {
    /// Forward `f`, full backward `b`, and weight part `w` (default `b/2`); `i = b - w`.
    pub fn new(f: f64, b: f64, w: Option<f64>) -> Result<Self, CostError> {
        RawStageCost {
            f: Some(f),
            b: Some(b),
            w,
            ..Default::default()
        }
        .resolve(&Place::Field("cost"), false)
    }

    /// Bytes still held after the input backward until W: `activation_bytes * w_memory`,
    /// rounded (all of them by default).
    pub fn w_activation_bytes(&self) -> u64 {
        if self.w_memory >= 1.0 {
            self.activation_bytes
        } else {
            (self.activation_bytes as f64 * self.w_memory).round() as u64
        }
    }

    /// Time of a compute kind run on its own: its computation plus the communication inside
    /// it ([`comm_of`](Self::comm_of)); zero for the hand-off kinds (timed by the link).
    pub fn of(&self, kind: ActionKind) -> f64 {
        let compute = match kind {
            ActionKind::F => self.f,
            ActionKind::B => self.b,
            ActionKind::I => self.i,
            ActionKind::W => self.w,
            ActionKind::R => self.r.unwrap_or(self.f),
            _ => 0.0,
        };
        compute + self.comm_of(kind)
    }

    /// Communication inside a compute kind (the all-to-all): `f_comm` for F, `r_comm` (else
    /// the forward's `f_comm`) for R, `b_comm` for B and I; none for W.
    pub fn comm_of(&self, kind: ActionKind) -> f64 {
        match kind {
            ActionKind::F => self.f_comm,
            ActionKind::R => self.r_comm.unwrap_or(self.f_comm),
            ActionKind::B | ActionKind::I => self.b_comm,
            _ => 0.0,
        }
    }

    /// The same costs divided over `v` chunks: time (communication too: each chunk holds
    /// `1/v` of the layers and their all-to-alls) and activations scale by `1/v` (so do the
    /// optimizer and all-reduce, which follow the parameters), hand-off size does not (every
    /// chunk boundary carries a whole activation).
    pub fn split(&self, v: u32) -> StageCost {
        let k = f64::from(v.max(1));
        StageCost {
            f: self.f / k,
            b: self.b / k,
            i: self.i / k,
            w: self.w / k,
            f_comm: self.f_comm / k,
            b_comm: self.b_comm / k,
            activation_bytes: self.activation_bytes / u64::from(v.max(1)),
            w_memory: self.w_memory,
            p2p_bytes: self.p2p_bytes,
            p2p_time: self.p2p_time,
            overlap: self.overlap.map(|t| t / k),
            optimizer: self.optimizer / k,
            dp_allreduce: self.dp_allreduce / k,
            r: self.r.map(|t| t / k),
            r_comm: self.r_comm.map(|t| t / k),
            kept_bytes: self.kept_bytes,
        }
    }
}

/// Costs of every stage, and the point-to-point link model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// One entry per stage.
    pub stages: Vec<StageCost>,
    /// Fixed time of every point-to-point transfer.
    pub p2p_latency: f64,
    /// Bytes per time unit of a link; `None` for infinitely fast.
    pub bandwidth: Option<f64>,
    /// Host time per action and per message, and whose runtime places them (see
    /// [`host`](super::host)); `None`: none, pipewright's lowering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostCosts>,
}

impl CostModel {
    /// Every stage with the same costs, no communication time.
    pub fn uniform(stages: u32, cost: StageCost) -> Self {
        CostModel {
            stages: vec![cost; stages as usize],
            p2p_latency: 0.0,
            bandwidth: None,
            host: None,
        }
    }

    /// Refuse costs whose sums over a run of `microbatches` microbatches on `stages` stages
    /// cannot be represented, though each value on its own can: a step's time (every action
    /// and transfer, one after another) past `f64`'s range would make the makespan infinite
    /// and the bubble 100%, and activation bytes held at once past `u64` would wrap.
    pub fn check_totals(&self, stages: u32, microbatches: u64) -> Result<(), CostError> {
        let m = microbatches as f64;
        let used = &self.stages[..(stages as usize).min(self.stages.len())];
        let transfer = self.p2p_latency
            + used
                .iter()
                .map(|c| self.bandwidth.map_or(0.0, |bw| c.p2p_bytes as f64 / bw))
                .fold(0.0, f64::max);
        let time: f64 = used
            .iter()
            .map(|c| {
                let per = c.f
                    + c.b
                    + c.i
                    + c.w
                    + c.r.unwrap_or(c.f)
                    + c.overlap.unwrap_or(0.0)
                    + 2.0 * (c.f_comm + c.b_comm);
                per * m
                    + 4.0 * m * c.p2p_time.unwrap_or(0.0).max(transfer)
                    + c.optimizer
                    + c.dp_allreduce
            })
            .sum();
        // Headroom: the simulator adds start and end times of what it sums here.
        if !(time.is_finite() && time < f64::MAX / 16.0) {
            return Err(CostError::TimeTotal { total: time });
        }
        let bytes: u128 = used
            .iter()
            .map(|c| {
                let held = u128::from(c.activation_bytes) + u128::from(c.kept_bytes.unwrap_or(0));
                (held + 2 * u128::from(c.p2p_bytes)) * u128::from(microbatches)
            })
            .sum();
        if bytes > u128::from(u64::MAX) {
            return Err(CostError::BytesTotal {
                total: bytes as f64,
            });
        }
        Ok(())
    }

    /// Time of a compute action: its stage's cost of its kind, computation plus the
    /// communication inside it; for an F&B overlap, the forward stage's measured `overlap`
    /// time, or else [`overlap_time`] of the F's and the B's parts.
    pub fn duration(&self, a: Action) -> f64 {
        let stage = |s: u32| &self.stages[s as usize];
        match a.kind {
            ActionKind::Overlap { b_stage, .. } => {
                let (f, b) = (stage(a.stage), stage(b_stage));
                f.overlap
                    .unwrap_or_else(|| overlap_time((f.f, f.f_comm), (b.b, b.b_comm)))
            }
            kind => stage(a.stage).of(kind),
        }
    }

    /// Communication inside a compute action (an overlap's: both parts'), hidden or not.
    pub fn comm(&self, a: Action) -> f64 {
        a.parts()
            .map(|p| self.stages[p.stage as usize].comm_of(p.kind))
            .sum()
    }

    /// Communication an F&B overlap hides: what its parts would take one after the other
    /// less its time, at most their communication (a measured `overlap` shorter than that
    /// also saved computation, which is not communication). 0 for any other action.
    pub fn comm_hidden(&self, a: Action) -> f64 {
        if !matches!(a.kind, ActionKind::Overlap { .. }) {
            return 0.0;
        }
        let sequential: f64 = a
            .parts()
            .map(|p| self.stages[p.stage as usize].of(p.kind))
            .sum();
        (sequential - self.duration(a)).clamp(0.0, self.comm(a))
    }

    /// Bytes a recomputed microbatch of `stage` keeps between its F and its R: the stage's
    /// `kept_bytes`, or else its input, the previous stage's hand-off.
    pub fn kept_bytes(&self, stage: u32) -> u64 {
        let s = stage as usize;
        let input = s.checked_sub(1).and_then(|p| self.stages.get(p));
        match self.stages.get(s).and_then(|c| c.kept_bytes) {
            Some(b) => b,
            None => input.map_or(0, |c| c.p2p_bytes),
        }
    }

    /// Time to move stage `s`'s output (or its gradient) between devices.
    pub fn transfer_time(&self, stage: u32) -> f64 {
        let cost = self.stages.get(stage as usize);
        if let Some(t) = cost.and_then(|c| c.p2p_time) {
            return t;
        }
        let bytes = cost.map_or(0, |c| c.p2p_bytes) as f64;
        self.p2p_latency + self.bandwidth.map_or(0.0, |bw| bytes / bw)
    }

    /// Read a JSON cost file for a timetable with `stages` stages. See [`RawCostFile`].
    pub fn from_json(text: &str, stages: u32) -> Result<Self, CostError> {
        let raw: RawCostFile = serde_json::from_str(text).map_err(|e| CostError::Json {
            line: e.line(),
            column: e.column(),
            message: without_position(&e),
        })?;
        raw.resolve(stages)
    }

    /// The same model cut into `stages` stages. A cost model describes the model's depth:
    /// stage `k` of `n` is the `k`-th of `n` equal slices. Cutting each slice into `stages / n`
    /// pieces splits its times and activations evenly; joining `n / stages` neighbours sums
    /// them, and the hand-off of a joined stage is its last piece's. So costs measured with
    /// one chunk count serve a simulation or a search with another. The measured fixed part
    /// of each action (`host.call`) is not split or summed: every piece pays it once.
    pub fn resample(&self, stages: u32) -> Result<CostModel, CostError> {
        let n = self.stages.len() as u32;
        let call = self.host.map(|h| h.call).unwrap_or_default();
        let resampled = if n == stages {
            self.stages.clone()
        } else if n > 0 && stages > 0 && stages % n == 0 {
            let k = stages / n;
            self.stages
                .iter()
                .flat_map(|c| {
                    let (bare, fixed) = without_fixed(c, &call);
                    vec![with_fixed(bare.split(k), fixed); k as usize]
                })
                .collect()
        } else if n > 0 && stages > 0 && n % stages == 0 {
            self.stages
                .chunks((n / stages) as usize)
                .map(|parts| {
                    let apart: Vec<_> = parts.iter().map(|c| without_fixed(c, &call)).collect();
                    let bare: Vec<StageCost> = apart.iter().map(|(c, _)| *c).collect();
                    with_fixed(join(&bare), apart[0].1)
                })
                .collect()
        } else {
            return Err(CostError::Resample { given: n, stages });
        };
        Ok(CostModel {
            stages: resampled,
            ..self.clone()
        })
    }

    /// Check the link model.
    pub fn with_link(
        mut self,
        p2p_latency: f64,
        bandwidth: Option<f64>,
    ) -> Result<Self, CostError> {
        check("p2p latency", p2p_latency)?;
        if let Some(bw) = bandwidth {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(CostError::Bandwidth(bw));
            }
        }
        self.p2p_latency = p2p_latency;
        self.bandwidth = bandwidth;
        Ok(self)
    }
}

/// Time of one F and one B chunk of two microbatches run as DualPipe's overlap, from each
/// part's `(computation, communication)`: `f = (f, f_comm)` of the forward's stage and
/// `b = (b, b_comm)` of the backward's:
///
/// `max(f + b, f_comm + b_comm, f + f_comm, b + b_comm)`.
///
/// DualPipe (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.2.1 and its figure 4)
/// cuts each chunk into attention, all-to-all dispatch, MLP and all-to-all combine, and runs
/// one microbatch's communication while the other computes. Assumptions: a device has one
/// computation stream and one communication stream, each serial (so the pair takes at least
/// `f + b` and at least `f_comm + b_comm`); a microbatch's own communication and computation
/// depend on each other in turn and never overlap (so at least `f + f_comm` and `b + b_comm`);
/// the pieces are fine (many layers per chunk), so the two streams reach the largest of these
/// bounds (the first and last piece, one layer's worth, is not counted); and communication
/// does not slow computation (DualPipe gives it dedicated SMs, whose cost belongs in the
/// measured `f` and `b`). With no communication it is `f + b`, today's sequential sum.
pub fn overlap_time(f: (f64, f64), b: (f64, f64)) -> f64 {
    let ((fc, fm), (bc, bm)) = (f, b);
    (fc + bc).max(fm + bm).max(fc + fm).max(bc + bm)
}

/// `c` without each time's fixed part (`call`, at most the time itself), and those parts: a
/// stage cut or joined pays each action's fixed part once, so it is taken out first and put
/// back after.
fn without_fixed(c: &StageCost, call: &CallCosts) -> (StageCost, [f64; 4]) {
    let fixed = [
        call.f.min(c.f),
        call.b.min(c.b),
        call.i.min(c.i),
        call.w.min(c.w),
    ];
    let mut bare = *c;
    bare.f -= fixed[0];
    bare.b -= fixed[1];
    bare.i -= fixed[2];
    bare.w -= fixed[3];
    (bare, fixed)
}

fn with_fixed(mut c: StageCost, fixed: [f64; 4]) -> StageCost {
    c.f += fixed[0];
    c.b += fixed[1];
    c.i += fixed[2];
    c.w += fixed[3];
    c
}

/// Neighbouring stages as one: times and activations add up; the hand-off is the last one's;
/// the fraction held for W is the parts' average weighted by their activations (plain
/// average when they carry no sizes), so the joined stage holds what its parts held.
fn join(parts: &[StageCost]) -> StageCost {
    let sum = |f: fn(&StageCost) -> f64| parts.iter().map(f).sum::<f64>();
    let overlap = parts.iter().map(|c| c.overlap).sum::<Option<f64>>();
    let r = parts.iter().any(|c| c.r.is_some());
    let bytes: u64 = parts.iter().map(|c| c.activation_bytes).sum();
    let w_memory = if parts.iter().all(|c| c.w_memory == 1.0) {
        1.0
    } else if bytes > 0 {
        sum(|c| c.activation_bytes as f64 * c.w_memory) / bytes as f64
    } else {
        sum(|c| c.w_memory) / parts.len().max(1) as f64
    };
    StageCost {
        f: sum(|c| c.f),
        b: sum(|c| c.b),
        i: sum(|c| c.i),
        w: sum(|c| c.w),
        f_comm: sum(|c| c.f_comm),
        b_comm: sum(|c| c.b_comm),
        activation_bytes: bytes,
        w_memory,
        p2p_bytes: parts.last().map_or(0, |c| c.p2p_bytes),
        p2p_time: parts.last().and_then(|c| c.p2p_time),
        overlap,
        optimizer: sum(|c| c.optimizer),
        dp_allreduce: sum(|c| c.dp_allreduce),
        r: r.then(|| sum(|c| c.r.unwrap_or(c.f))),
        r_comm: parts
            .iter()
            .any(|c| c.r_comm.is_some())
            .then(|| sum(|c| c.r_comm.unwrap_or(c.f_comm))),
        // The joined stage's input is its first piece's.
        kept_bytes: parts.first().and_then(|c| c.kept_bytes),
    }
}

pub(super) fn check(what: &str, v: f64) -> Result<(), CostError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(CostError::Invalid {
            what: what.to_string(),
            value: v,
        })
    }
}
