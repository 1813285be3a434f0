//! Whether a configuration fits: the memory model ([`pipewright_model::memory::predict`]) over the
//! configuration's own timetable, so every family's in-flight microbatches are counted by
//! the one walk the memory model does.
//!
//! Families whose in-flight microbatches are bounded (1F1B, interleaving, the zero-bubble and
//! V schedules: at most `2p` or so, DESIGN.md's table) reach their peak within the first
//! `4p` microbatches, so their timetables are walked with `min(m, 4p)`; GPipe and looped BFS
//! hold every microbatch at once and are walked with all `m`.
//!
//! Before that walk, a cheaper lower bound screens most candidates out: the same memory model
//! over a one-microbatch timetable with the same stages and placement (looped BFS for loop
//! placements, ZBV for the V). Every family, with any `m`, at some point holds at least what
//! one microbatch holds there (a device's first backward comes after the microbatch's
//! forwards through all its chunks), so a configuration whose bound does not fit cannot
//! fit. The bound depends on fewer dimensions than a configuration (not the family within a
//! placement, nor `m`), so it is cached.
//!
//! Both walks depend on a configuration's timetable only (family, `p`, `v`, the microbatches
//! walked and the recompute plan), which thousands of configurations share: each timetable
//! is walked once ([`Profile`]) and replayed with each configuration's bytes.

use super::cluster::Precision;
use super::config::{Config, PlanRequest};
use super::evaluate::timetable;
use super::model::PlanModel;
use super::PlanError;
use pipewright_model::memory::{
    predict, predict_profiled, Accounting, MemPrecision, MemoryBreakdown, MemoryConfig, ModelShape,
    Profile,
};
use pipewright_schedule::timetable::Timetable;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

use pipewright_model::shape::AttentionKind;
use pipewright_schedule::recompute::Recompute;
use pipewright_schedule::spec::{Placement, ScheduleKind};

/// The memory model's view of `cfg` for a GPT of `shape` (Megatron's accounting: a plan is
/// for a real cluster).
pub fn memory_config(req: &PlanRequest, shape: &ModelShape, cfg: &Config) -> MemoryConfig {
    MemoryConfig {
        shape: *shape,
        precision: match req.precision {
            Precision::Bf16 => MemPrecision::Bf16,
            Precision::Tf32 | Precision::F32 => MemPrecision::F32,
        },
        accounting: Accounting::Megatron,
        pp: cfg.pp,
        tp: cfg.tp,
        dp: cfg.dp,
        v: cfg.v,
        microbatch_size: cfg.microbatch_size,
        sequence_parallel: cfg.sequence_parallel,
        zero: cfg.zero,
        recompute: cfg.recompute_plan(),
        attention: req.attention,
        experts: pipewright_model::memory::moe::ExpertLayout {
            ep: cfg.ep,
            etp: cfg.etp,
            capacity: req.capacity_factor,
        },
    }
}

/// Microbatches whose timetable shows `cfg`'s peak.
fn memory_microbatches(cfg: &Config) -> u32 {
    match cfg.schedule {
        ScheduleKind::GPipe | ScheduleKind::LoopedBfs => cfg.microbatches,
        _ => cfg.microbatches.min(4 * cfg.pp),
    }
}

/// What the one-microbatch bound depends on.
type BoundKey = (
    u32,
    u32,
    u32,
    u32,
    u64,
    Recompute,
    u32,
    u8,
    bool,
    Placement,
    u32,
    u32,
);

/// What a configuration's timetable, and so the memory walk, depends on: family, `p`, `v`,
/// microbatches, and the recompute policy with the devices it is on.
type WalkKey = (ScheduleKind, u32, u32, u32, Recompute, u32);

/// Cached one-microbatch lower bounds on the worst device's peak, and cached walks.
#[derive(Default)]
pub struct BoundCache {
    bounds: HashMap<BoundKey, u64>,
    walks: HashMap<WalkKey, Profile>,
}

impl BoundCache {
    /// A lower bound on `cfg`'s worst device peak (see the module docs).
    pub fn lower_bound(&mut self, req: &PlanRequest, cfg: &Config) -> Result<u64, PlanError> {
        let placement = cfg.schedule.placement();
        let key = (
            cfg.tp,
            cfg.pp,
            cfg.dp,
            cfg.v,
            cfg.microbatch_size,
            cfg.recompute,
            cfg.recompute_devices,
            cfg.zero,
            cfg.sequence_parallel,
            placement,
            cfg.ep,
            cfg.etp,
        );
        if let Some(&b) = self.bounds.get(&key) {
            return Ok(b);
        }
        let one = Config {
            schedule: match placement {
                Placement::Loop => ScheduleKind::LoopedBfs,
                Placement::V => ScheduleKind::Zbv,
            },
            microbatches: 1,
            ..*cfg
        };
        let b = worst(&self.peaks_at(req, &one, 1)?);
        self.bounds.insert(key, b);
        Ok(b)
    }

    /// [`peaks`], from a cached walk.
    pub fn peaks(
        &mut self,
        req: &PlanRequest,
        cfg: &Config,
    ) -> Result<Vec<MemoryBreakdown>, PlanError> {
        self.peaks_at(req, cfg, memory_microbatches(cfg))
    }

    /// Each device's peak over `cfg`'s timetable with `m` microbatches, a GPT's from the
    /// cached walk of that timetable.
    fn peaks_at(
        &mut self,
        req: &PlanRequest,
        cfg: &Config,
        m: u32,
    ) -> Result<Vec<MemoryBreakdown>, PlanError> {
        let PlanModel::Gpt(shape) = &req.model else {
            return peaks_over(req, cfg, &timetable(cfg, m)?);
        };
        let key = (
            cfg.schedule,
            cfg.pp,
            cfg.v,
            m,
            cfg.recompute,
            cfg.recompute_devices,
        );
        let profile = match self.walks.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(Profile::new(&timetable(cfg, m)?)?),
        };
        Ok(predict_profiled(&memory_config(req, shape, cfg), profile)?)
    }
}

/// Each pipeline device's predicted peak, by category.
pub fn peaks(req: &PlanRequest, cfg: &Config) -> Result<Vec<MemoryBreakdown>, PlanError> {
    peaks_over(req, cfg, &timetable(cfg, memory_microbatches(cfg))?)
}

/// Each pipeline device's predicted peak, by category, over a timetable of `cfg`'s shape
/// that need not be its family's (a searched one).
pub fn peaks_over(
    req: &PlanRequest,
    cfg: &Config,
    tt: &Timetable,
) -> Result<Vec<MemoryBreakdown>, PlanError> {
    predict_for(req, cfg, tt, Accounting::Megatron)
}

/// The memory model of `req`'s model over `tt` (a GPT's under `accounting`; a profile's
/// bytes as measured).
fn predict_for(
    req: &PlanRequest,
    cfg: &Config,
    tt: &Timetable,
    accounting: Accounting,
) -> Result<Vec<MemoryBreakdown>, PlanError> {
    match &req.model {
        PlanModel::Gpt(shape) => {
            let mem = MemoryConfig {
                accounting,
                ..memory_config(req, shape, cfg)
            };
            Ok(predict(&mem, tt)?)
        }
        PlanModel::Layers(profile) => super::layers::peaks(profile, cfg, tt),
    }
}

/// Each pipeline device's peak as pipewright's own runtime would hold it (the memory model's
/// `Pipewright` accounting, every microbatch): what `plan --validate` compares with `train`'s
/// measured peaks. Those runs are in-process on the CPU, whose attention is materialized,
/// whatever the request planned for.
pub fn peaks_as_run(req: &PlanRequest, cfg: &Config) -> Result<Vec<MemoryBreakdown>, PlanError> {
    let tt = timetable(cfg, cfg.microbatches)?;
    let req = PlanRequest {
        attention: AttentionKind::Materialized,
        ..req.clone()
    };
    predict_for(&req, cfg, &tt, Accounting::Pipewright)
}

/// The worst device's peak in bytes.
pub fn worst(peaks: &[MemoryBreakdown]) -> u64 {
    peaks.iter().map(MemoryBreakdown::total).max().unwrap_or(0)
}
