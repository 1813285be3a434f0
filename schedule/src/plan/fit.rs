//! Whether a configuration fits: the memory model ([`crate::memory::predict`]) over the
//! configuration's own timetable, so every family's in-flight microbatches are counted by
//! the one walk the memory model does.
//!
//! Families whose in-flight microbatches are bounded (1F1B, interleaving, the zero-bubble and
//! V schedules: at most `2p` or so, DESIGN.md's table) reach their peak within the first
//! `4p` microbatches, so their timetables are walked with `min(m, 4p)`; GPipe and looped BFS
//! hold every microbatch at once and are walked with all `m`.

use super::cluster::Precision;
use super::config::{Config, PlanRequest};
use super::evaluate::timetable;
use super::PlanError;
use crate::memory::{predict, Accounting, MemPrecision, MemoryBreakdown, MemoryConfig};
use crate::recompute::RecomputePlan;
use crate::spec::ScheduleKind;

/// The memory model's view of `cfg` (Megatron's accounting: a plan is for a real cluster).
pub fn memory_config(req: &PlanRequest, cfg: &Config) -> MemoryConfig {
    MemoryConfig {
        shape: req.shape.clone(),
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
        recompute: RecomputePlan::uniform(cfg.recompute),
    }
}

/// Microbatches whose timetable shows `cfg`'s peak.
fn memory_microbatches(cfg: &Config) -> u32 {
    match cfg.schedule {
        ScheduleKind::GPipe | ScheduleKind::LoopedBfs => cfg.microbatches,
        _ => cfg.microbatches.min(4 * cfg.pp),
    }
}

/// Each pipeline device's predicted peak, by category.
pub fn peaks(req: &PlanRequest, cfg: &Config) -> Result<Vec<MemoryBreakdown>, PlanError> {
    let tt = timetable(cfg, memory_microbatches(cfg))?;
    Ok(predict(&memory_config(req, cfg), &tt)?)
}

/// The worst device's peak in bytes.
pub fn worst(peaks: &[MemoryBreakdown]) -> u64 {
    peaks.iter().map(MemoryBreakdown::total).max().unwrap_or(0)
}
