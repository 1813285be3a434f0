//! `search`'s list scheduler as a family of the plan, where sizes permit.
//!
//! The generator families are functions of `(p, v, m)` alone; `search`'s list scheduler (with
//! its round heuristic and gap filling) plays a step forward with the configuration's own
//! costs under its memory cap, and can beat every family there: a heavy last stage, or a cap
//! under which 1F1B-like families must recompute while a timetable that keeps fewer
//! microbatches in flight fits without it.
//!
//! After the bounded search, for the best few ranked configurations (one per tp, pp, dp, microbatch
//! size and count, ZeRO and SP) whose `pp x m` is at most [`MAX_SEARCHED_SIZE`],
//! [`pipewright_search::search`] runs (for a GPT; a layer-list profile is not searched) with that
//! configuration's cost model ([`super::costs::cost_model`]), the cluster's memory per GPU as a
//! byte cap on the memory model's whole-rank total, and the steady-state period as its objective;
//! once without recomputation, and once with the row's policy on every stage where it has one (its
//! recompute time folded into the input backward the `R` will precede). What the user fixed is
//! kept: no search under a fixed `--schedule`, only the fixed recompute policy and `v`. The
//! search's costs for other chunk counts are resampled, so its best is then judged again exactly:
//! the timetable with the policy's `R`s written in, simulated with the cost model of its own `v`
//! and placement, its memory predicted over its own actions. Only a timetable that fits and is
//! faster than the best fixed family of the same shape becomes a row.
//!
//! A searched row's [`Config`] names the generator family with the timetable's placement
//! (1F1B for one loop chunk, interleaved for more, ZBV for the V), so that the cost model,
//! the bounds and the terms see the right devices; the timetable itself rides beside it in
//! [`PlanRow::searched`] ([`Searched`]), since `Config` is a small `Copy + Hash` key.

use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::fit::{memory_config, peaks_over, worst};
use super::refused::Refusals;
pub use super::row::Searched;
use super::row::{row, PlanRow};
use super::PlanError;
use pipewright_model::memory::ModelShape;
use pipewright_schedule::recompute::{insert, Recompute, RecomputePlan};
use pipewright_schedule::spec::{Placement, ScheduleKind, ScheduleSpec};
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;
use pipewright_search::{
    search, MemoryCap, Objective, SearchError, SearchOutcome, SearchSpec, PERIOD_STEPS,
};
use pipewright_sim::simulate::{simulate_steps, CostModel, SimError};

/// Largest `pp x m` searched: a search runs a few dozen candidates and up to
/// [`IMPROVE_BUDGET`] gap-filling simulations of `3 m` microbatches over `pp` devices, so its
/// time grows with `pp x m`; at this size a search takes tens of milliseconds in release
/// (BENCHMARKS.md), and the 1T plan's shapes (pp 16 x m 128 and more) are not searched.
pub const MAX_SEARCHED_SIZE: u64 = 256;

/// Simulations spent filling the search's best's gaps (the `search` command's default is 200).
pub const IMPROVE_BUDGET: usize = 40;

/// The dimensions a search keeps (it chooses the family, `v` and the order of the work).
fn shape_key(c: &Config) -> (u32, u32, u32, u64, u32, u8, bool) {
    (
        c.tp,
        c.pp,
        c.dp,
        c.microbatch_size,
        c.microbatches,
        c.zero,
        c.sequence_parallel,
    )
}

/// Whether `cfg` is small enough to search (and pipelined at all).
pub fn permits(cfg: &Config) -> bool {
    cfg.pp >= 2 && u64::from(cfg.pp) * u64::from(cfg.microbatches) <= MAX_SEARCHED_SIZE
}

/// Search the shapes of the first `max_searched` distinct shapes among `found` that permit
/// it, and add each searched timetable that beats its shape's best fixed row. Returns the
/// number of searches run; a search that fails is noted in `refused` and its shape keeps its
/// fixed rows.
pub fn add_searched(
    req: &PlanRequest,
    found: &mut Vec<PlanRow>,
    keep: usize,
    max_searched: usize,
    refused: &mut Refusals,
) -> usize {
    // A family fixed by hand is what the user asked for; no searched timetable is one. The
    // search's byte cap is the GPT memory model's; a layer-list profile is not searched.
    if req.fixed.schedule.is_some() || req.model.gpt().is_none() {
        return 0;
    }
    let mut bases: Vec<PlanRow> = Vec::new();
    for r in found.iter() {
        let new = !bases
            .iter()
            .any(|b| shape_key(&b.config) == shape_key(&r.config));
        if r.searched.is_none() && permits(&r.config) && new && bases.len() < max_searched {
            bases.push(r.clone());
        }
    }
    let mut runs = 0;
    for base in bases {
        let mut policies = vec![req.fixed.recompute.unwrap_or(Recompute::None)];
        if !policies.contains(&base.config.recompute) {
            policies.push(base.config.recompute);
        }
        let mut best: Option<PlanRow> = None;
        for policy in policies {
            runs += 1;
            let r = match searched_row(req, &base, policy) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    refused.note(&base.config, format!("the schedule search: {e}"));
                    continue;
                }
            };
            if best
                .as_ref()
                .map_or(true, |b| r.step_time_s < b.step_time_s)
            {
                best = Some(r);
            }
        }
        if let Some(r) = best {
            let at = found.partition_point(|x| x.step_time_s <= r.step_time_s);
            found.insert(at, r);
            found.truncate(keep);
        }
    }
    runs
}

/// `base`'s shape searched with recomputation `policy` on every stage: the row of its best
/// timetable if that fits and beats `base`, judged exactly.
fn searched_row(
    req: &PlanRequest,
    base: &PlanRow,
    policy: Recompute,
) -> Result<Option<PlanRow>, PlanError> {
    let capacity = req.cluster.memory_bytes();
    let Some(shape) = req.model.gpt() else {
        return Ok(None);
    };
    let cfg = &base.config;
    let at_v = Config {
        recompute: policy,
        recompute_devices: cfg.pp,
        ..searched_v(req, shape, cfg)
    };
    let Some(outcome) = search_at(req, shape, &at_v, capacity)? else {
        return Ok(None);
    };
    let label = outcome.candidates[outcome.best].label.clone();
    let plan = RecomputePlan::uniform(policy);
    let tt = if plan.is_none() {
        outcome.timetable
    } else {
        Checked::new(insert(&outcome.timetable, &plan)).map_err(SimError::from)?
    };
    let exact = Config {
        v: tt.num_stages() / cfg.pp,
        schedule: kind_of(placement(&tt), tt.num_stages() / cfg.pp),
        ..at_v
    };
    let (costs, _) = cost_model(req, &exact);
    let step = period(&tt, &costs)?;
    let memory = peaks_over(req, &exact, &tt)?;
    let v_kept = req.fixed.v.map_or(true, |v| v == exact.v);
    if !v_kept || worst(&memory) > capacity || step >= base.step_time_s {
        return Ok(None);
    }
    let bound = super::bound::lower_bound(&exact, &costs);
    let mut r = row(req, exact, step, bound, memory);
    r.searched = Some(Box::new(Searched {
        label,
        fixed: base.config,
        fixed_step_s: base.step_time_s,
        timetable: tt,
    }));
    Ok(Some(r))
}

/// `cfg` at the chunk count the search gets: a v fixed by hand, else 2 where the layers
/// allow two chunks per device (so both v = 1, joined, and v = 2 come from the cost model's
/// own cuts; two chunks need m >= p, as interleaving), else 1.
fn searched_v(req: &PlanRequest, shape: &ModelShape, cfg: &Config) -> Config {
    let two = ScheduleSpec::new(
        ScheduleKind::Interleaved1F1B,
        cfg.pp,
        2,
        cfg.microbatches,
        None,
    );
    let v = match req.fixed.v {
        Some(v) => v,
        None if 2 * cfg.pp <= shape.layers && two.is_ok() => 2,
        None => 1,
    };
    Config {
        v,
        schedule: kind_of(Placement::Loop, v),
        ..*cfg
    }
}

/// The list scheduler's search of `at_v` under the GPU's memory; `None` where nothing it
/// builds fits (the fixed rows stand).
fn search_at(
    req: &PlanRequest,
    shape: &ModelShape,
    at_v: &Config,
    capacity: u64,
) -> Result<Option<SearchOutcome>, PlanError> {
    let spec = SearchSpec {
        max_virtual: at_v.v,
        families: Vec::new(),
        improve_budget: IMPROVE_BUDGET,
        objective: Objective::Period,
        memory: Some(memory_config(req, shape, at_v)),
        time_budget: None,
        ..SearchSpec::new(
            at_v.pp,
            at_v.microbatches,
            folded(cost_model(req, at_v).0),
            MemoryCap::Bytes(capacity),
        )
    };
    match search(&spec) {
        Ok(o) => Ok(Some(o)),
        Err(
            SearchError::NothingFits { .. }
            | SearchError::StaticOverCap { .. }
            | SearchError::NoCandidates(_)
            | SearchError::Memory(_),
        ) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The steady-state period of `tt` under `costs`, every microbatch simulated (a list
/// schedule need not repeat itself, so no extrapolation).
pub fn period(tt: &Checked, costs: &CostModel) -> Result<f64, PlanError> {
    Ok(simulate_steps(tt, costs, PERIOD_STEPS)?.report.period)
}

/// Costs in which each stage's recomputation runs as part of its input backward: the `R`
/// the plan writes in sits right before it, so the list scheduler places the two as one.
fn folded(mut costs: CostModel) -> CostModel {
    for c in &mut costs.stages {
        if let Some(r) = c.r.take() {
            c.i += r;
            c.b += r;
        }
    }
    costs
}

/// How a timetable places its stages: the V when the second chunk of the last device
/// follows it, else loop.
fn placement(tt: &Timetable) -> Placement {
    let p = tt.num_devices();
    match tt.device_of(p) {
        Some(d) if p > 1 && d == p - 1 => Placement::V,
        _ => Placement::Loop,
    }
}

/// A generator family with `placement` and `v` chunks per device, for the cost model's and
/// the bounds' view of a searched timetable's devices.
fn kind_of(placement: Placement, v: u32) -> ScheduleKind {
    match placement {
        Placement::V => ScheduleKind::Zbv,
        Placement::Loop if v == 1 => ScheduleKind::OneFOneB,
        Placement::Loop => ScheduleKind::Interleaved1F1B,
    }
}

/// The configuration as the table shows it: a searched row names the search's label in
/// place of the family and its chunks.
pub fn configuration(r: &PlanRow) -> String {
    let c = &r.config;
    let text = c.to_string();
    match &r.searched {
        None => text,
        Some(s) => text.replacen(
            &format!(" {} v {} ", c.schedule, c.v),
            &format!(" searched ({}) ", s.label),
            1,
        ),
    }
}

/// The `--explain` line of a searched best: what the search bought over the best fixed
/// family of its shape.
pub fn explain(best: &PlanRow) -> Option<String> {
    let s = best.searched.as_ref()?;
    let gain = 100.0 * (1.0 - best.step_time_s / s.fixed_step_s);
    // Four decimals in the step's own unit: the two times can differ by well under 1%.
    let (scale, unit) = super::explain::unit_of(best.step_time_s);
    let fmt = |x: f64| format!("{:.4} {unit}", x * scale);
    Some(format!(
        "search: its timetable ({}) is {gain:.1}% faster than the best fixed family of the same tp, pp, dp, microbatch size and count ({}: {} against {})",
        s.label,
        s.fixed,
        fmt(s.fixed_step_s),
        fmt(best.step_time_s)
    ))
}
