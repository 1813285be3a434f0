//! When a memory cap forces it, the search recomputes: only the microbatches alive at a
//! device's peak, so it beats recomputing whole stages (Megatron's and DeepSpeed's way), and
//! never when the cap does not need it.

use pipewright_schedule::recompute::insert;
use pipewright_schedule::Checked;
use pipewright_schedule::{
    generate, validate, ActionKind, Recompute, RecomputePlan, ScheduleKind, ScheduleSpec,
};
use pipewright_search::{search, MemoryCap, SearchError, SearchSpec, PERIOD_STEPS};
use pipewright_sim::simulate::simulate_steps;
use pipewright_sim::{CostModel, StageCost};

/// Activation bytes of one stage per microbatch; a stage's input (the hand-off) is a quarter.
const UNIT: u64 = 1200;

fn costs(p: u32) -> CostModel {
    let mut c = StageCost::new(1.0, 2.0, Some(1.0)).unwrap();
    c.activation_bytes = UNIT;
    c.p2p_bytes = UNIT / 4;
    CostModel::uniform(p, c).with_link(0.05, None).unwrap()
}

fn spec(p: u32, m: u32, cap: f64, families: &[ScheduleKind]) -> SearchSpec {
    SearchSpec {
        families: families.to_vec(),
        list_scheduler: false,
        ..SearchSpec::new(p, m, costs(p), MemoryCap::Microbatches(cap))
    }
}

#[test]
fn a_cap_below_every_family_is_met_by_recomputing_only_what_the_peaks_hold() {
    let (p, m) = (4, 12);
    // 1F1B's device 0 holds 4 microbatches and device 1 holds 3: neither fits 2.5.
    let found = search(&spec(p, m, 2.5, &[ScheduleKind::OneFOneB])).unwrap();
    let best = &found.candidates[found.best];
    assert!(best.fits && best.recomputes > 0, "{best:?}");
    assert!(best.label.starts_with("1f1b + recompute"), "{}", best.label);
    validate(&found.timetable).unwrap();
    let peak = found.simulation.report.peak_activation_bytes();
    assert!(peak as f64 <= 2.5 * UNIT as f64, "{peak} bytes");
    // Devices 2 and 3 fit as they are: nothing of theirs is recomputed.
    for d in 2..p as usize {
        let rs = found.timetable.devices[d].iter();
        assert!(
            rs.filter(|a| a.kind == ActionKind::R).count() == 0,
            "device {d}"
        );
    }
    // Recomputing every stage fully (one R per microbatch and stage) fits too, and is slower.
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, p, 1, m, None).unwrap());
    let all = Checked::new(insert(&tt, &RecomputePlan::uniform(Recompute::Full))).unwrap();
    let all_period = simulate_steps(&all, &costs(p), PERIOD_STEPS)
        .unwrap()
        .report
        .period;
    assert!(
        best.period < all_period,
        "{} against {all_period}",
        best.period
    );
    assert!(best.recomputes < p * m);
}

#[test]
fn recomputation_is_never_added_where_the_cap_does_not_need_it() {
    let families = ScheduleKind::ALL;
    let found = search(&spec(4, 8, 4.0, &families)).unwrap();
    assert_eq!(found.candidates[found.best].recomputes, 0);
    // The candidates that do recompute are only those of families over the cap.
    for c in found.candidates.iter().filter(|c| c.recomputes > 0) {
        let base = &c.label[..c.label.find(" + recompute").unwrap()];
        let plain = found.candidates.iter().find(|x| x.label == base).unwrap();
        assert!(!plain.fits, "{base} fits without recomputing");
        assert!(c.period >= plain.period - 1e-9, "{}", c.label);
    }
}

#[test]
fn a_cap_below_what_recomputation_reaches_names_the_least_it_needs() {
    let e = search(&spec(4, 8, 0.5, &[ScheduleKind::OneFOneB])).unwrap_err();
    assert!(matches!(e, SearchError::NothingFits { .. }), "{e}");
    // Device 1 regrows one whole stash while two others wait, each a quarter (their input).
    let e = e.to_string();
    assert!(
        e.contains("the least any candidate needs is 1.5 microbatches (1f1b + recompute "),
        "{e}"
    );
}
