//! Closed-form lower bounds on a configuration's step time, to skip hopeless candidates
//! before simulating any.
//!
//! A device cannot finish a step faster than its own compute: `m` times the F, B and R of
//! its stages, plus its optimizer steps (which the runtime runs between steps, on the
//! compute stream). To that each family adds the bubble its closed form (DESIGN.md's table,
//! uniform costs, no communication) cannot avoid, with `F`, `B`, `W` the busiest device's
//! per-microbatch times summed over its chunks:
//! - gpipe, 1f1b: `(p-1)(F+B)`; interleaved-1f1b, looped-bfs: `(p-1)(F+B)/v`;
//! - zb-h1: `(p-1)(F+B-W)`; zb-h2: `(p-1)(F+B-2W)` (at least 0);
//! - zbv, dualpipev: 0 (their bubbles can vanish).
//!
//! Communication only lengthens a step, so these stay below the simulated period up to the
//! unevenness of real stages (a last stage with the LM head); the search therefore keeps
//! simulating until a bound exceeds the best found by a margin ([`super::search`]).

use super::config::Config;
use pipewright_schedule::spec::{Placement, ScheduleKind};
use pipewright_sim::simulate::CostModel;

/// Per device, per microbatch: compute of its chunks, and its optimizer time per step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceLoad {
    /// Forward.
    pub f: f64,
    /// Backward (I + W).
    pub b: f64,
    /// Weight part of the backward.
    pub w: f64,
    /// Recomputation.
    pub r: f64,
    /// Optimizer (and ZeRO-1 all-gather) per step.
    pub optimizer: f64,
    /// Which pipeline device.
    pub device: u32,
}

impl DeviceLoad {
    /// Compute per microbatch.
    pub fn compute(&self) -> f64 {
        self.f + self.b + self.r
    }
}

/// The pipeline device of stage `s` under `cfg`'s family's placement.
pub fn device_of(cfg: &Config, s: u32) -> u32 {
    let p = cfg.pp;
    match cfg.schedule.placement() {
        Placement::Loop => s % p,
        Placement::V if s < p => s,
        Placement::V => 2 * p - 1 - s,
    }
}

/// The busiest device's load (largest compute per microbatch).
pub fn busiest(cfg: &Config, costs: &CostModel) -> DeviceLoad {
    let mut loads: Vec<DeviceLoad> = (0..cfg.pp)
        .map(|device| DeviceLoad {
            device,
            ..DeviceLoad::default()
        })
        .collect();
    for (s, c) in costs.stages.iter().enumerate() {
        let d = device_of(cfg, s as u32) as usize;
        let l = &mut loads[d];
        l.f += c.f;
        l.b += c.b;
        l.w += c.w;
        // The plan's cost models set `r` exactly when the stage recomputes.
        l.r += c.r.unwrap_or(0.0);
        l.optimizer += c.optimizer;
    }
    loads.into_iter().fold(DeviceLoad::default(), |a, l| {
        if l.compute() > a.compute() {
            l
        } else {
            a
        }
    })
}

/// The family's unavoidable bubble for the busiest device's load.
pub fn bubble(cfg: &Config, l: &DeviceLoad) -> f64 {
    let p1 = f64::from(cfg.pp.saturating_sub(1));
    let (f, b, w) = (l.f + l.r, l.b, l.w);
    match cfg.schedule {
        ScheduleKind::GPipe | ScheduleKind::OneFOneB => p1 * (f + b),
        ScheduleKind::Interleaved1F1B | ScheduleKind::LoopedBfs => p1 * (f + b) / f64::from(cfg.v),
        ScheduleKind::ZbH1 => p1 * (f + b - w).max(0.0),
        ScheduleKind::ZbH2 => p1 * (f + b - 2.0 * w).max(0.0),
        ScheduleKind::Zbv | ScheduleKind::DualPipeV => 0.0,
    }
}

/// Lower bound on the step time of `cfg` under `costs`.
pub fn lower_bound(cfg: &Config, costs: &CostModel) -> f64 {
    let l = busiest(cfg, costs);
    f64::from(cfg.microbatches) * l.compute() + bubble(cfg, &l) + l.optimizer
}
