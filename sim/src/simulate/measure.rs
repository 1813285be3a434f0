//! Costs measured, not guessed: the per-stage F, B, I and W times of recorded steps and the
//! hand-off time between devices, as a cost file that `simulate` and `search` read. This
//! closes the loop from a real run to a better schedule.

use pipewright_schedule::action::ActionKind;
use pipewright_schedule::timeline::Timeline;

use super::cost::{CostError, Place, RawCostFile, RawStageCost};
use super::hand_off::{measured_latency, median};
use super::host::{HostCosts, Runtime};

/// The median duration of each stage's F, B, I and W over `timelines` (steps of one run).
///
/// A stage that ran full backwards gets `b` (the file's reader splits it `w = b/2` unless
/// told); one that ran I and W gets both, so a run of a split schedule (zb-h1, zbv) measures
/// the split. F&B overlaps are not used: their two halves cannot be told apart. Explicit
/// recomputes (`R` actions) give `r`; a recompute the runtime ran inside a backward is part
/// of that backward's time.
///
/// `p2p_latency` is the median hand-off time between devices over every hand-off whose
/// consumer was waiting for it (see [`hand_offs`](super::hand_offs)): from the producer's
/// compute end to the consumer's compute start, so it holds whatever a hand-off costs on the
/// way (posting the send, the transport, waking the consumer). It is left out where no
/// consumer waited (one device, or no hand-off on any critical path): the steps then say
/// nothing about it.
pub fn measured_costs(timelines: &[&Timeline]) -> Result<RawCostFile, CostError> {
    measured_costs_with(timelines, &[], None)
}

/// [`measured_costs`] of a runtime whose host time was measured too (`host`), with the other
/// backward measured in `probe`: steps on the same stages with each backward split (or
/// fused), from which each stage whose own steps ran only fused backwards takes its `i` and
/// `w` (or, having run only split ones, its `b`). The file then has `b` beside `i` and `w`,
/// each as measured: in PyTorch's runtime a split backward costs more than the fused one (two
/// passes through autograd).
///
/// With `host`, the file carries it, and `p2p_latency` is the time in transit: the measured
/// hand-off less the posting of its send, which the simulator charges on the producer.
pub fn measured_costs_with(
    timelines: &[&Timeline],
    probe: &[&Timeline],
    host: Option<HostCosts>,
) -> Result<RawCostFile, CostError> {
    let Some(first) = timelines.first() else {
        return Err(CostError::Missing {
            place: Place::Words("measured costs".into()),
            what: "recorded steps",
        });
    };
    let stages = first.meta.stages as usize;
    // The probe must time the same stages on the same devices, in the same unit.
    let shape = |t: &Timeline| {
        let m = &t.meta;
        format!(
            "{} stages on {} devices in {}",
            m.stages, m.devices, m.time_unit
        )
    };
    if let Some(other) = probe.iter().find(|t| shape(t) != shape(first)) {
        return Err(CostError::ProbeStages {
            probe: shape(other),
            stages: shape(first),
        });
    }
    let mut seen = durations(timelines, stages);
    let mut probed = durations(probe, stages);
    let apart = host.is_some_and(|h| h.runtime == Runtime::Pytorch);
    // The probe gives each stage the backward its own steps did not run: I and W where they
    // ran B, B where they ran I and W.
    for (own, probe) in seen.iter_mut().zip(&mut probed) {
        if own[2].is_empty() && own[3].is_empty() {
            own[2] = std::mem::take(&mut probe[2]);
            own[3] = std::mem::take(&mut probe[3]);
        }
        if own[1].is_empty() {
            own[1] = std::mem::take(&mut probe[1]);
        }
    }
    let per_stage = seen
        .into_iter()
        .enumerate()
        .map(|(s, mut kinds)| stage_cost(s, &mut kinds, apart))
        .collect::<Result<Vec<_>, _>>()?;
    let latency = measured_latency(timelines);
    let hand_off = match latency {
        Some((_, n)) => format!("; p2p_latency: median of {n} hand-offs a device waited for"),
        None => "; no hand-off between devices that a device waited for".into(),
    };
    let in_transit = |t: f64| (t - host.map_or(0.0, |h| h.send)).max(0.0);
    let probed = if probe.is_empty() {
        String::new()
    } else {
        format!(
            "; the other backward from {} steps of {}",
            probe.len(),
            probe[0].meta.schedule
        )
    };
    Ok(RawCostFile {
        default: RawStageCost::default(),
        stages: Some(per_stage),
        p2p_latency: latency.map(|(t, _)| in_transit(t)),
        bandwidth: None,
        time_unit: Some(first.meta.time_unit.clone()),
        source: Some(format!(
            "measured: {} on {} devices, {} stages, {} microbatches, median of {} steps{hand_off}{probed}",
            first.meta.schedule,
            first.meta.devices,
            first.meta.stages,
            first.meta.microbatches,
            timelines.len()
        )),
        host,
    })
}

/// Durations per stage, per kind (F, B, I, W, R) over `timelines`.
fn durations(timelines: &[&Timeline], stages: usize) -> Vec<[Vec<f64>; 5]> {
    let mut seen: Vec<[Vec<f64>; 5]> = vec![Default::default(); stages];
    for tl in timelines {
        for e in tl.compute_events() {
            let slot = match e.action.kind {
                ActionKind::F => 0,
                ActionKind::B => 1,
                ActionKind::I => 2,
                ActionKind::W => 3,
                ActionKind::R => 4,
                _ => continue,
            };
            if let Some(s) = seen.get_mut(e.action.stage as usize) {
                s[slot].push(e.end - e.start);
            }
        }
    }
    seen
}

/// A stage's medians. Where both the fused and the split backward were measured, `apart`
/// keeps all three (else the split, which says more).
fn stage_cost(
    stage: usize,
    kinds: &mut [Vec<f64>; 5],
    apart: bool,
) -> Result<RawStageCost, CostError> {
    let [f, b, i, w, r] = kinds.each_mut().map(|d| median(d));
    let missing = |what| CostError::Missing {
        place: Place::Words(format!("measured stage {stage}")),
        what,
    };
    let f = f.ok_or(missing("forward (F) events"))?;
    let (b, i, w) = match (b, i, w) {
        (Some(b), Some(i), Some(w)) if apart => (Some(b), Some(i), Some(w)),
        (_, Some(i), Some(w)) => (None, Some(i), Some(w)),
        (Some(b), _, _) => (Some(b), None, None),
        _ => return Err(missing("standalone backward (B, or I and W) events")),
    };
    Ok(RawStageCost {
        f: Some(f),
        b,
        i,
        w,
        r,
        ..RawStageCost::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{simulate, CostModel, StageCost};
    use pipewright_schedule::Checked;
    use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

    #[test]
    fn a_simulated_step_measures_back_to_its_own_costs() {
        let spec = ScheduleSpec::new(ScheduleKind::ZbH1, 3, 1, 6, None).unwrap();
        let mut costs = CostModel::uniform(3, StageCost::new(1.0, 3.0, Some(1.25)).unwrap());
        costs.stages[2].f = 2.5;
        let sim = simulate(&Checked::new(generate(&spec)).unwrap(), &costs).unwrap();
        let raw = measured_costs(&[&sim.timeline]).unwrap();
        let back = raw.resolve(3).unwrap();
        for (got, want) in back.stages.iter().zip(&costs.stages) {
            assert_eq!(
                (got.f, got.i, got.w, got.b),
                (want.f, want.i, want.w, want.b)
            );
        }
        // A full-backward schedule measures b, and the reader splits it evenly.
        let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 3, 1, 6, None).unwrap();
        let sim = simulate(&Checked::new(generate(&spec)).unwrap(), &costs).unwrap();
        let back = measured_costs(&[&sim.timeline])
            .unwrap()
            .resolve(3)
            .unwrap();
        assert_eq!((back.stages[0].b, back.stages[0].w), (3.0, 1.5));
        let e = measured_costs(&[]).unwrap_err().to_string();
        assert_eq!(e, "measured costs: no recorded steps given");
    }
}
