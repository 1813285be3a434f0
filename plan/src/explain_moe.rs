//! `--explain`'s line on a mixture's expert all-to-all: how much of it a step of the best
//! configuration does, how much its schedule hid behind the other microbatch's compute
//! (DualPipeV's overlapped F&B pairs: [`pipewright_sim::simulate::Report::comm_hidden`]),
//! and the same figures under 1F1B at the same mesh and microbatches.

use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::evaluate::{one_step, step_time};
use super::PlanError;
use pipewright_schedule::spec::ScheduleKind;

/// Per step, over the pipeline devices of one replica: all-to-all seconds, the part hidden,
/// and the step time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllToAllShare {
    /// All-to-all seconds, summed over the pipeline devices.
    pub comm: f64,
    /// Of them, hidden behind compute.
    pub hidden: f64,
    /// The step time.
    pub step: f64,
}

/// `cfg`'s all-to-all per step (one simulated step of all its microbatches), `None` for a
/// model without one.
pub fn share(req: &PlanRequest, cfg: &Config) -> Result<Option<AllToAllShare>, PlanError> {
    let (costs, _) = cost_model(req, cfg);
    if costs
        .stages
        .iter()
        .all(|c| c.f_comm == 0.0 && c.b_comm == 0.0)
    {
        return Ok(None);
    }
    let report = one_step(cfg, &costs)?.report;
    Ok(Some(AllToAllShare {
        comm: report.comm,
        hidden: report.comm_hidden,
        step: step_time(cfg, &costs)?,
    }))
}

/// The line for the best configuration `best` (`None` for a dense model).
pub fn line(req: &PlanRequest, best: &Config) -> Result<Option<String>, PlanError> {
    let Some(b) = share(req, best)? else {
        return Ok(None);
    };
    let per_device = |s: &AllToAllShare| s.comm / f64::from(best.pp);
    let pct = |s: &AllToAllShare| 100.0 * s.hidden / s.comm.max(f64::MIN_POSITIVE);
    let mut text = format!(
        "expert all-to-all: {:.3} s a step on each pipeline device (recompute's repeats aside), {:.0}% of it hidden by {}",
        per_device(&b),
        pct(&b),
        best.schedule
    );
    if best.schedule != ScheduleKind::OneFOneB {
        let plain = Config {
            schedule: ScheduleKind::OneFOneB,
            v: 1,
            ..*best
        };
        if let Some(o) = share(req, &plain)? {
            text.push_str(&format!(
                "; 1f1b at the same mesh hides {:.0}% and takes {:.3} s a step against {:.3} s",
                pct(&o),
                o.step,
                b.step
            ));
        }
    }
    Ok(Some(text))
}
