//! Where a configuration's step time goes, what limits it, and why the best beat the rest.
//!
//! A step of the busiest pipeline device splits into: its matmul and element-wise work
//! (`compute`), recomputation (`recompute`, time paid to fit in memory), TP collectives
//! (`tp_comm`, on the compute stream: Megatron does not overlap them), the optimizer step,
//! the part of the pipeline sends and of the DP reduction the schedule does not hide
//! (`pp_comm`, `dp_comm`: the step time minus the step time re-simulated with that
//! communication free), and the rest, the `bubble`.
//!
//! The limiting bound is `compute` when the overheads together are under a fifth of the
//! step; else the largest overhead, with recomputation reported as `memory`.

use serde::{Deserialize, Serialize};

use super::bound::{busiest, device_of};
use super::config::Config;
use super::evaluate::step_time;
use super::pieces::Pieces;
use super::worded::{with, Worded};
use super::PlanError;
use pipewright_schedule::recompute::Recompute;
use pipewright_sim::simulate::CostModel;

/// Seconds per step, by cause; they add up to the step time (the busiest device's work never
/// exceeds the period).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Terms {
    /// Matmul and element-wise work of the busiest device.
    pub compute: f64,
    /// Recomputation.
    pub recompute: f64,
    /// TP collectives.
    pub tp_comm: f64,
    /// Exposed pipeline sends.
    pub pp_comm: f64,
    /// Exposed DP gradient reduction.
    pub dp_comm: f64,
    /// Optimizer step (and ZeRO-1's parameter all-gather).
    pub optimizer: f64,
    /// Idle time the schedule leaves.
    pub bubble: f64,
    /// Exposed expert all-to-all (a mixture's dispatch and combine the schedule does not hide
    /// behind another microbatch's compute); 0 for a dense model.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ep_comm: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// What limits a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Limit {
    /// Work: the overheads are small.
    Compute,
    /// Pipeline idle time.
    Bubble,
    /// TP collectives.
    TpComm,
    /// Pipeline sends.
    PpComm,
    /// DP gradient reduction.
    DpComm,
    /// Expert all-to-all.
    EpComm,
    /// Recomputation, paid to fit in memory.
    Memory,
}

impl Limit {
    /// Name in tables.
    pub const fn name(self) -> &'static str {
        match self {
            Limit::Compute => "compute",
            Limit::Bubble => "bubble",
            Limit::TpComm => "TP comm",
            Limit::PpComm => "PP comm",
            Limit::DpComm => "DP comm",
            Limit::EpComm => "EP comm",
            Limit::Memory => "memory",
        }
    }
}

/// TP time per microbatch of the device with the most compute, and the part of it that
/// full recomputation's rerun forwards add.
fn device_tp(cfg: &Config, costs: &CostModel, p: &Pieces) -> (f64, f64) {
    let d = busiest(cfg, costs).device;
    let stages = cfg.stages();
    (0..stages)
        .filter(|&s| device_of(cfg, s) == d)
        .map(|s| {
            let n = f64::from(p.layers[s as usize]);
            let ends = if s == 0 || s + 1 == stages {
                p.embed_tp
            } else {
                0.0
            };
            let rerun = if cfg.recompute_of(s) == Recompute::Full {
                n * p.layer_tp
            } else {
                0.0
            };
            (n * p.layer_tp * 2.0 + ends + rerun, rerun)
        })
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y))
}

/// The terms of `cfg`'s `step` under `costs` (two more simulations: with free sends, and
/// with a free DP reduction).
pub fn terms(cfg: &Config, costs: &CostModel, p: &Pieces, step: f64) -> Result<Terms, PlanError> {
    let m = f64::from(cfg.microbatches);
    let load = busiest(cfg, costs);
    let (tp, rerun) = device_tp(cfg, costs, p);
    let (tp_comm, tp_in_r) = (m * tp, m * rerun);
    let recompute = m * load.r - tp_in_r;
    let compute = m * load.compute() - tp_comm - recompute;
    let mut free_p2p = costs.clone();
    free_p2p
        .stages
        .iter_mut()
        .for_each(|c| c.p2p_time = Some(0.0));
    let pp_comm = (step - step_time(cfg, &free_p2p)?).max(0.0);
    let mut free_dp = costs.clone();
    free_dp.stages.iter_mut().for_each(|c| c.dp_allreduce = 0.0);
    let dp_comm = (step - step_time(cfg, &free_dp)?).max(0.0);
    let optimizer = load.optimizer;
    let ep_comm = exposed_all_to_all(cfg, costs, step)?;
    // The two exposures are measured one at a time, so together they can count an overlap
    // twice; what exceeds the step comes off them (DP first), so the terms add up to it.
    let work = compute + recompute + tp_comm + optimizer + ep_comm;
    let mut excess = (work + pp_comm + dp_comm - step).max(0.0);
    let dp_comm = dp_comm - excess.min(dp_comm);
    excess = (work + pp_comm + dp_comm - step).max(0.0);
    let pp_comm = pp_comm - excess.min(pp_comm);
    Ok(Terms {
        compute,
        recompute,
        tp_comm,
        pp_comm,
        dp_comm,
        optimizer,
        bubble: (step - work - pp_comm - dp_comm).max(0.0),
        ep_comm,
    })
}

/// The part of `step` the expert all-to-all adds: the step minus the step re-simulated with
/// it free (0 without one).
pub fn exposed_all_to_all(cfg: &Config, costs: &CostModel, step: f64) -> Result<f64, PlanError> {
    if costs
        .stages
        .iter()
        .all(|c| c.f_comm == 0.0 && c.b_comm == 0.0)
    {
        return Ok(0.0);
    }
    Ok((step - step_time(cfg, &free_all_to_all(costs))?).max(0.0))
}

/// `costs` with the all-to-all free.
pub fn free_all_to_all(costs: &CostModel) -> CostModel {
    let mut free = costs.clone();
    free.stages.iter_mut().for_each(|c| {
        c.f_comm = 0.0;
        c.b_comm = 0.0;
    });
    free
}

impl Terms {
    /// Their sum.
    pub fn total(&self) -> f64 {
        self.compute
            + self.recompute
            + self.tp_comm
            + self.pp_comm
            + self.dp_comm
            + self.optimizer
            + self.bubble
            + self.ep_comm
    }

    /// The overheads, named.
    pub fn overheads(&self) -> [(Limit, f64); 6] {
        [
            (Limit::Bubble, self.bubble),
            (Limit::TpComm, self.tp_comm),
            (Limit::PpComm, self.pp_comm),
            (Limit::DpComm, self.dp_comm),
            (Limit::Memory, self.recompute),
            (Limit::EpComm, self.ep_comm),
        ]
    }

    /// What limits the step (see the module docs).
    pub fn limit(&self) -> Limit {
        let over: f64 = self.overheads().iter().map(|(_, t)| t).sum();
        if over < 0.2 * self.total() {
            return Limit::Compute;
        }
        self.overheads()
            .into_iter()
            .fold((Limit::Compute, 0.0), |a, b| if b.1 > a.1 { b } else { a })
            .0
    }

    /// Named differences `other - self`, largest in size first (the terms of the step).
    pub fn differences(&self, other: &Terms) -> Vec<(&'static str, f64)> {
        let mut d = vec![
            ("compute", other.compute - self.compute),
            ("recompute", other.recompute - self.recompute),
            ("TP comm", other.tp_comm - self.tp_comm),
            ("PP comm", other.pp_comm - self.pp_comm),
            ("DP comm", other.dp_comm - self.dp_comm),
            ("optimizer", other.optimizer - self.optimizer),
            ("bubble", other.bubble - self.bubble),
            ("EP comm", other.ep_comm - self.ep_comm),
        ];
        d.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
        d
    }
}

/// The dimensions a neighbour can differ in, named as the fields that fix them (each face
/// writes them its way: the CLI's `--tp`, Python's `tp=`).
pub const DIMENSIONS: [&str; 7] = [
    "tp",
    "pp",
    "schedule",
    "microbatch_size",
    "recompute",
    "zero",
    "sequence_parallel",
];

/// The value of dimension `d` (an index into [`DIMENSIONS`]) of `c`, for comparing.
fn value(c: &Config, d: usize) -> String {
    match d {
        0 => c.tp.to_string(),
        1 => c.pp.to_string(),
        2 => format!("{} v {}", c.schedule, c.v),
        3 => c.microbatch_size.to_string(),
        4 => c.recompute_plan().to_string(),
        5 => c.zero.to_string(),
        _ => c.sequence_parallel.to_string(),
    }
}

/// Among `others`, for each dimension the configuration closest to `best` that differs from
/// it there (fewest other dimensions changed, then fastest): `(dimension, index)`.
pub fn neighbours(best: &Config, others: &[(Config, f64)]) -> Vec<(usize, usize)> {
    let differing = |c: &Config| {
        (0..DIMENSIONS.len())
            .filter(|&d| value(c, d) != value(best, d))
            .count()
    };
    let mut out: Vec<(usize, usize)> = Vec::new();
    for d in 0..DIMENSIONS.len() {
        let pick = others
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| value(c, d) != value(best, d))
            .min_by(|(_, a), (_, b)| {
                differing(&a.0)
                    .cmp(&differing(&b.0))
                    .then(a.1.total_cmp(&b.1))
            });
        if let Some((i, _)) = pick {
            if !out.iter().any(|&(_, j)| j == i) {
                out.push((d, i));
            }
        }
    }
    out
}

/// The unit that suits times near a step of `step` seconds, and its factor from seconds.
pub fn unit_of(step: f64) -> (f64, &'static str) {
    match step.abs() {
        s if s >= 1.0 || s == 0.0 => (1.0, "s"),
        s if s >= 1e-3 => (1e3, "ms"),
        _ => (1e6, "us"),
    }
}

/// `x` seconds in the unit that suits a step of `step` seconds (s, ms or us, so a small
/// model's sub-millisecond terms do not all read as 0.00 s), two decimals; `signed` writes a
/// `+` on a positive difference.
pub fn seconds(x: f64, step: f64, signed: bool) -> String {
    let (scale, unit) = unit_of(step);
    let v = x * scale;
    if signed {
        format!("{v:+.2} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// Why `best` beat `other` (its neighbour in dimension `d`): one line with the step times'
/// difference and the terms that make it, the dimension written with the neighbour's value
/// as each face writes a field (`--schedule zbv v 2 instead of ...`).
pub fn why(d: usize, best: (&Config, f64, &Terms), other: (&Config, f64, &Terms)) -> Worded {
    let diffs: Vec<String> = best
        .2
        .differences(other.2)
        .into_iter()
        .filter(|(_, x)| x.abs() > 0.005 * best.1)
        .take(3)
        .map(|(name, x)| format!("{name} {}", seconds(x, best.1, true)))
        .collect();
    let (field, theirs) = (DIMENSIONS[d], value(other.0, d));
    let rest = format!(
        " instead of {}: {:+.1}% step time ({}) [{}]",
        value(best.0, d),
        100.0 * (other.1 / best.1 - 1.0),
        if diffs.is_empty() {
            "a tie: no term differs by 0.5%".to_string()
        } else {
            diffs.join(", ")
        },
        other.0
    );
    Worded::new(move |name| with(name, field, &theirs) + &rest)
}

/// The dimensions `fields` (of [`DIMENSIONS`]) in one line saying no other value of them was
/// simulated, each written as a face writes a field without its value.
pub fn unexplored(fields: Vec<&'static str>) -> Worded {
    Worded::new(move |name| {
        let named: Vec<String> = fields.iter().map(|f| name(f, None)).collect();
        format!(
            "{}: no other value was simulated (it did not fit, was not allowed, or its lower bound was slower than the best)",
            named.join(", ")
        )
    })
}
