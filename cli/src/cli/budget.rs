//! What a request may ask of this machine, estimated before anything is allocated.
//!
//! A request whose estimate is beyond this machine's memory is refused in one line with the
//! figure, instead of being killed by the kernel (or aborting on a failed allocation) minutes
//! later. The estimates are deliberately generous upper bounds: they refuse what cannot fit,
//! not what merely might not.

use anyhow::{anyhow, Result};
use pipewright::schedule::memory::{predict, rough_bytes, MemoryConfig};
use pipewright::schedule::Timetable;

pub use pipewright::input::machine_memory;

/// Refuse `what` when it needs more than this machine's memory.
pub fn fits(what: &str, need: u64) -> Result<()> {
    Ok(pipewright::input::fits(what, need)?)
}

/// Refuse a timetable of `spm` stage-microbatches (p * v * m), `times` over (steps, panels),
/// when simulating it would not fit (`pipewright::input::timetable_fits`, Python's too).
pub fn timetable(what: &str, spm: u64, times: u64) -> Result<()> {
    Ok(pipewright::input::timetable_fits(what, spm, times)?)
}

/// Refuse a training run whose ranks (`ranks_here` of them in this process: every rank of
/// an in-process run, one under MPI) would not fit: the memory model's prediction of each
/// pipeline device's fullest rank, with half again for what it leaves out (temporaries
/// inside a layer) and the threads' stacks.
pub fn training(cfg: &MemoryConfig, tt: &Timetable, ranks_here: u64) -> Result<()> {
    let what = format!(
        "training {} layers of d_model {} (vocab {}, seq-len {}, {} sequences per microbatch) on {ranks_here} rank(s)",
        cfg.shape.layers, cfg.shape.d_model, cfg.shape.vocab, cfg.shape.seq_len, cfg.microbatch_size
    );
    // A closed-form upper bound first, in floating point: sizes whose products would
    // overflow 64 bits are refused by it before the model's integer arithmetic sees them.
    let rough = rough_bytes(cfg, tt.microbatches) * ranks_here as f64;
    if rough > (1u64 << 60) as f64 {
        return fits(&what, rough.min(u64::MAX as f64) as u64);
    }
    let devices = predict(cfg, tt).map_err(|e| anyhow!("{e}"))?;
    let ranks_per_device = u64::from(cfg.tp) * u64::from(cfg.dp);
    let whole: u64 = devices
        .iter()
        .map(|d| d.total().saturating_mul(ranks_per_device))
        .fold(0, u64::saturating_add);
    let here = if ranks_here >= ranks_per_device * u64::from(cfg.pp) {
        whole
    } else {
        devices.iter().map(|d| d.total()).max().unwrap_or(0)
    };
    let need = here
        .saturating_add(here / 2)
        .saturating_add(ranks_here << 23);
    fits(&what, need)
}
