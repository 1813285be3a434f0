//! A configuration's step time from the event simulator ([`simulate_steps`]), with the
//! microbatch count capped so a step of thousands of microbatches costs what one of a few
//! hundred does.
//!
//! Every family here repeats itself once its warm-up is over: past a few times `p`
//! microbatches, `p` more add one period of the steady phase, the same each time (1F1B's
//! period is `(m + p - 1)(F + B)`, interleaving's adds `v` chunks' F and B per microbatch,
//! the zero-bubble and V schedules likewise). So for `m > 3p` the plan simulates `m1 = 2p`
//! and `m2 = 3p` and extends the line: `T(m) = T(m1) + (m - m1) (T(m2) - T(m1)) / p`. The
//! tests check this against simulating every microbatch.

use super::config::Config;
use super::PlanError;
use pipewright_schedule::generators::generate;
use pipewright_schedule::recompute::insert;
use pipewright_schedule::spec::ScheduleSpec;
use pipewright_schedule::timetable::Timetable;
use pipewright_schedule::Checked;
use pipewright_sim::simulate::{simulate_steps, CostModel, SimError};

/// Steps simulated back to back (a warm-up and two to measure the period, as `search`).
const STEPS: u32 = pipewright_search::PERIOD_STEPS;

/// The compute-only timetable of `cfg` with `m` microbatches, recomputation written in.
pub fn timetable(cfg: &Config, m: u32) -> Result<Timetable, PlanError> {
    let spec = ScheduleSpec::new(cfg.schedule, cfg.pp, cfg.v, m, None)?;
    let tt = generate(&spec);
    let plan = cfg.recompute_plan();
    Ok(if plan.is_none() {
        tt
    } else {
        insert(&tt, &plan)
    })
}

/// Microbatch counts the plan simulates for `cfg`: all of them, or the two it extrapolates
/// from.
pub fn simulated_counts(cfg: &Config) -> (u32, Option<u32>) {
    let (p, m) = (cfg.pp, cfg.microbatches);
    if cfg.pp == 1 || m <= 3 * p {
        (m, None)
    } else {
        (2 * p, Some(3 * p))
    }
}

/// Steady-state period of `cfg`'s timetable with `m` microbatches under `costs`.
fn period_at(cfg: &Config, m: u32, costs: &CostModel) -> Result<f64, PlanError> {
    let tt = Checked::new(timetable(cfg, m)?).map_err(SimError::from)?;
    Ok(simulate_steps(&tt, costs, STEPS)?.report.period)
}

/// The predicted step time (steady-state period) of `cfg` under `costs`.
pub fn step_time(cfg: &Config, costs: &CostModel) -> Result<f64, PlanError> {
    if cfg.pp == 1 {
        return Ok(single_device(cfg, costs));
    }
    match simulated_counts(cfg) {
        (m, None) => period_at(cfg, m, costs),
        (m1, Some(m2)) => {
            let t1 = period_at(cfg, m1, costs)?;
            let t2 = period_at(cfg, m2, costs)?;
            let per = (t2 - t1) / f64::from(m2 - m1);
            Ok(t1 + f64::from(cfg.microbatches - m1) * per)
        }
    }
}

/// One step of `cfg` with all its microbatches, simulated event by event (for drawing the
/// best configuration's bubble chart).
pub fn one_step(cfg: &Config, costs: &CostModel) -> Result<pipewright_sim::Simulation, PlanError> {
    let tt = Checked::new(timetable(cfg, cfg.microbatches)?).map_err(SimError::from)?;
    Ok(pipewright_sim::simulate(&tt, costs)?)
}

/// One pipeline device: every microbatch's F, R and B in a row, then the gradient reduction
/// (nothing to overlap it with once the last backward is done) and the optimizer.
fn single_device(cfg: &Config, costs: &CostModel) -> f64 {
    let c = &costs.stages[0];
    // A recompute repeats the forward's communication (an MoE layer's all-to-all).
    let r = c.r.map_or(0.0, |r| r + c.f_comm);
    let comm = c.f_comm + c.b_comm;
    f64::from(cfg.microbatches) * (c.f + c.b + r + comm) + c.dp_allreduce + c.optimizer
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::recompute::Recompute;
    use pipewright_schedule::spec::ScheduleKind;
    use pipewright_sim::simulate::StageCost;

    fn costs(stages: u32) -> CostModel {
        let mut c: Vec<StageCost> = (0..stages)
            .map(|s| {
                let mut c = StageCost::new(1.0 + 0.1 * f64::from(s % 3), 2.1, Some(0.9)).unwrap();
                c.p2p_time = Some(0.05);
                c.dp_allreduce = 0.7;
                c.optimizer = 0.2;
                c
            })
            .collect();
        c.last_mut().unwrap().f += 0.5;
        CostModel {
            stages: c,
            p2p_latency: 0.0,
            bandwidth: None,
            host: None,
        }
    }

    #[test]
    fn extrapolated_periods_match_simulating_every_microbatch() {
        for kind in ScheduleKind::ALL {
            let v = kind
                .fixed_virtual()
                .unwrap_or(if kind.supports_virtual() { 2 } else { 1 });
            let cfg = Config {
                tp: 1,
                pp: 4,
                dp: 2,
                v,
                microbatch_size: 1,
                microbatches: 40,
                schedule: kind,
                recompute: Recompute::None,
                recompute_devices: 4,
                zero: 0,
                sequence_parallel: false,
                ep: 1,
                etp: 1,
            };
            let model = costs(4 * v);
            let predicted = step_time(&cfg, &model).unwrap();
            let exact = period_at(&cfg, 40, &model).unwrap();
            assert!(
                (predicted / exact - 1.0).abs() < 0.01,
                "{kind}: extrapolated {predicted} vs simulated {exact}"
            );
        }
    }
}
