//! DualPipeV and the F&B overlap action: closed forms as simulated, memory, text forms.

use pipewright_schedule::Checked;
use pipewright_schedule::{
    from_csv, generate, lower, to_csv, validate, Action, ActionKind, ScheduleKind, ScheduleSpec,
    SpecError, Timetable,
};
use pipewright_sim::{simulate, CostModel, StageCost};

fn run(p: u32, m: u32, (f, i, w): (f64, f64, f64), overlap: Option<f64>) -> pipewright_sim::Report {
    let spec = ScheduleSpec::new(ScheduleKind::DualPipeV, p, 2, m, None).unwrap();
    let mut cost = StageCost::new(f, i + w, Some(w)).unwrap();
    cost.overlap = overlap;
    let costs = CostModel::uniform(spec.stages(), cost);
    simulate(&Checked::new(generate(&spec)).unwrap(), &costs)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .report
}

#[test]
fn dualpipev_bubble_is_p_minus_1_times_fb_plus_b_minus_3w() {
    // (F, I, W) per chunk with F = I, F&B at its default F + B. Outside that (F != I, or an
    // F&B cheaper than F + B) the simulated bubble leaves this linear form: not claimed.
    let cases = [((1.0, 1.0, 1.0), None), ((1.0, 1.0, 0.5), None)];
    for ((f, i, w), overlap) in cases {
        let fb = overlap.unwrap_or(f + i + w);
        for p in [1, 2, 3, 4, 5, 6, 8, 16] {
            for m in 2 * p..=2 * p + 20 {
                let r = run(p, m, (f, i, w), overlap);
                let want = f64::from(p - 1) * (fb + (i + w) - 3.0 * w);
                let got = r.makespan - r.ideal;
                assert!(
                    (got - want).abs() < 1e-9,
                    "p={p} m={m} F={f} I={i} W={w} F&B={fb}: {got} != {want}"
                );
            }
        }
    }
}

#[test]
fn dualpipev_peak_is_2p_plus_1_chunk_microbatches() {
    for p in [1, 2, 3, 4, 8] {
        for m in [2 * p, 2 * p + 3, 4 * p] {
            let r = run(p, m, (1.0, 1.0, 1.0), None);
            for d in &r.devices {
                assert_eq!(d.peak_activations, 2 * p + 1, "p={p} m={m}");
            }
        }
    }
}

#[test]
fn dualpipev_needs_2p_microbatches_and_two_chunks() {
    let e = ScheduleSpec::new(ScheduleKind::DualPipeV, 4, 2, 7, None).unwrap_err();
    assert_eq!(e, SpecError::DualPipeTooFewMicrobatches { need: 8, m: 7 });
    assert!(
        e.to_string().starts_with("dualpipev needs m >= 2p = 8"),
        "{e}"
    );
    assert!(matches!(
        ScheduleSpec::new(ScheduleKind::DualPipeV, 4, 1, 8, None),
        Err(SpecError::VShapeNeedsTwo { .. })
    ));
}

#[test]
fn overlap_round_trips_through_csv_and_json_lowered() {
    let spec = ScheduleSpec::new(ScheduleKind::DualPipeV, 3, 2, 7, None).unwrap();
    let tt = lower(&generate(&spec)).unwrap();
    let overlaps = tt
        .devices
        .iter()
        .flatten()
        .filter(|a| matches!(a.kind, ActionKind::Overlap { .. }))
        .count();
    assert!(overlaps > 0);
    let csv = to_csv(&tt);
    assert!(csv.contains(")OVERLAP_F_B"), "{csv}");
    let (back, _) = from_csv(&csv).unwrap();
    assert_eq!(back.devices, tt.devices);
    assert_eq!(back.stage_device, tt.stage_device);
    let json = serde_json::to_string(&tt).unwrap();
    assert_eq!(serde_json::from_str::<Timetable>(&json).unwrap(), tt);
    assert!(validate(&tt).unwrap().lowered);
}

#[test]
fn overlap_costs_its_own_time_and_counts_as_f_and_b() {
    // One device, stages 0 and 1, two microbatches: F0 F1 B1 | (0F1;1B0) | ... by hand.
    let text = "0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\n";
    let (tt, _) = from_csv(text).unwrap();
    validate(&tt).unwrap();
    let mut costs = CostModel::uniform(2, StageCost::new(1.0, 2.0, None).unwrap());
    let sim = simulate(&Checked::new(tt.clone()).unwrap(), &costs).unwrap();
    let ov = sim.timeline.events[2];
    assert_eq!((ov.start, ov.end), (2.0, 5.0), "default: F + B");
    assert_eq!(sim.report.devices[0].peak_activations, 3);
    costs.stages[0].overlap = Some(2.0);
    let sim = simulate(&Checked::new(tt.clone()).unwrap(), &costs).unwrap();
    assert_eq!(
        sim.timeline.events[2].end, 4.0,
        "the forward stage's overlap time"
    );
}

#[test]
fn overlap_parts_must_not_depend_on_each_other() {
    // The B of (0,0) inside the overlap that runs F(0,1) is fine; B of its own F is not.
    let (tt, _) = from_csv("0F0,1F0,1B0,(0F1;0B1)OVERLAP_F_B,1F1,1B1,0B0\n").unwrap();
    let e = validate(&tt).unwrap_err();
    assert!(e.to_string().contains("backward before its forward"), "{e}");
    let a: Action = "(0F1;1B0)OVERLAP_F_B".parse().unwrap();
    assert_eq!(a, Action::overlap(0, 1, 1, 0));
    let parts: Vec<String> = a.parts().map(|p| p.to_string()).collect();
    assert_eq!(parts, ["0F1", "1B0"]);
}
