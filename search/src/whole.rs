//! A byte cap on the whole rank: with a [`MemoryConfig`], a candidate fits when every
//! device's predicted total (parameters, gradients, optimizer state and stashed activations,
//! [`pipewright_model::memory::predict`]) is within the cap, not just its activations.

use pipewright_model::memory::{predict, MemoryConfig, MemoryError};
use pipewright_schedule::spec::Placement;
use pipewright_schedule::timetable::Timetable;

use super::SearchError;

/// `mem` for a timetable's pipeline: its devices and chunks per device.
fn for_timetable(mem: &MemoryConfig, tt: &Timetable) -> MemoryConfig {
    let p = tt.num_devices().max(1);
    MemoryConfig {
        pp: p,
        v: (tt.num_stages() / p).max(1),
        ..mem.clone()
    }
}

/// The largest predicted total of any device of `tt`; `None` when the model does not fit
/// the candidate (more stages than layers, a recompute plan naming a stage it lacks).
pub(super) fn peak_total(mem: &MemoryConfig, tt: &Timetable) -> Option<u64> {
    let per_device = predict(&for_timetable(mem, tt), tt).ok()?;
    per_device.iter().map(|m| m.total()).max()
}

/// The cap in the search's units for its pruning and list scheduler: what the cap leaves for
/// activations once the neediest device of a one-chunk pipeline has its parameters,
/// gradients and optimizer state, over one unit (a microbatch's activations of `1/p` of the
/// model). Returns `(cap in units, bytes of a unit)`.
pub(super) fn units_cap(mem: &MemoryConfig, p: u32, bytes: u64) -> Result<(f64, f64), SearchError> {
    let mut tt = Timetable::empty("static", p, p, 1, Placement::Loop);
    let cfg = for_timetable(mem, &tt);
    let fixed = predict(&cfg, &tt)?;
    let need = fixed.iter().map(|m| m.total()).max().unwrap_or(0);
    if need >= bytes {
        return Err(SearchError::StaticOverCap { cap: bytes, need });
    }
    // One microbatch through every stage: the stashes of the whole model, once.
    tt.devices = (0..p)
        .map(|d| {
            vec![pipewright_schedule::action::Action::new(
                d,
                pipewright_schedule::action::ActionKind::F,
                0,
            )]
        })
        .collect();
    let once: u64 = predict(&cfg, &tt)?.iter().map(|m| m.activations).sum();
    let unit = once as f64 / f64::from(p);
    if unit <= 0.0 {
        return Err(SearchError::Memory(MemoryError::NotPositive(
            "activation bytes",
        )));
    }
    Ok(((bytes - need) as f64 / unit, unit))
}
