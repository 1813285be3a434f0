//! Communication inside actions (`f_comm`, `b_comm`: expert parallelism's all-to-all):
//! sequential actions pay it, an F&B overlap hides it as `overlap_time`'s closed form says.

use pipewright_schedule::Checked;
use pipewright_schedule::{from_csv, generate, validate, ScheduleKind, ScheduleSpec, Timetable};
use pipewright_sim::{overlap_time, simulate, CostModel, Report, StageCost};

/// Two devices, one stage each, two microbatches. Device 1 runs its second F beside its
/// first B. By hand (no hand-off time; F = f + f_comm, B = b + b_comm, T the overlap):
/// device 0: F [0,F], F [F,2F]; device 1: F [F,2F], overlap [2F, 2F+T], B [2F+T, 2F+T+B];
/// device 0: B [2F+T, 2F+T+B], B [2F+T+B, 2F+T+2B]. Makespan 2F + T + 2B.
const WITH_OVERLAP: &str = "0F0,0F1,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n";
/// The same pipeline as 1F1B: makespan 3F + 3B.
const ONE_F_ONE_B: &str = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";

fn timetable(text: &str) -> Timetable {
    let (tt, _) = from_csv(text).unwrap();
    validate(&tt).unwrap();
    tt
}

/// f = 1, b = 2 (i = w = 1), with the given all-to-all times.
fn costs(f_comm: f64, b_comm: f64) -> CostModel {
    let cost = StageCost {
        f_comm,
        b_comm,
        ..StageCost::new(1.0, 2.0, None).unwrap()
    };
    CostModel::uniform(2, cost)
}

fn run(text: &str, costs: &CostModel) -> Report {
    simulate(&Checked::new(timetable(text)).unwrap(), costs)
        .unwrap()
        .report
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn overlap_time_is_the_busier_stream_or_the_longer_microbatch() {
    // Dense: F + B, as before any communication was modelled.
    assert_eq!(overlap_time((1.0, 0.0), (2.0, 0.0)), 3.0);
    // All comm fits beside the other's compute: the compute stream decides.
    assert_eq!(overlap_time((1.0, 0.5), (2.0, 0.5)), 3.0);
    // The backward microbatch alone, its compute then its own comm, decides.
    assert_eq!(overlap_time((1.0, 1.5), (2.0, 2.5)), 4.5);
    // The comm stream decides.
    assert_eq!(overlap_time((1.0, 3.0), (2.0, 1.0)), 4.0);
}

#[test]
fn an_overlap_hides_all_some_or_no_communication_and_1f1b_pays_it_all() {
    // (f_comm, b_comm, T by hand, hidden by hand: F + B - T).
    let cases = [
        // Dense: nothing to hide, the overlap is F + B = 3.
        (0.0, 0.0, 3.0, 0.0),
        // Fully hidden: max(3, 1, 1.5, 2.5) = 3 = f + b, all of 0.5 + 0.5 hidden.
        (0.5, 0.5, 3.0, 1.0),
        // Partly: max(3, 4, 2.5, 4.5) = 4.5; F + B = 2.5 + 4.5 = 7, so 2.5 of 4 hidden.
        (1.5, 2.5, 4.5, 2.5),
    ];
    for (fm, bm, t, hidden) in cases {
        let c = costs(fm, bm);
        let (f, b) = (1.0 + fm, 2.0 + bm);
        let r = run(WITH_OVERLAP, &c);
        assert!(
            close(r.makespan, 2.0 * f + t + 2.0 * b),
            "comm ({fm}, {bm}): overlap makespan {} != {}",
            r.makespan,
            2.0 * f + t + 2.0 * b
        );
        let seq = run(ONE_F_ONE_B, &c);
        assert!(
            close(seq.makespan, 3.0 * (f + b)),
            "comm ({fm}, {bm}): 1F1B makespan {}",
            seq.makespan
        );
        // Each device runs two F and two B: comm 2 (fm + bm) each, 4 (fm + bm) in all.
        let all = 4.0 * (fm + bm);
        assert!(
            close(r.comm, all) && close(seq.comm, all),
            "{} {}",
            r.comm,
            seq.comm
        );
        assert!(
            close(r.comm_hidden, hidden),
            "hidden {} != {hidden}",
            r.comm_hidden
        );
        assert!(close(r.devices[1].comm_hidden, hidden) && r.devices[0].comm_hidden == 0.0);
        assert_eq!(seq.comm_hidden, 0.0, "1F1B hides nothing");
        if all > 0.0 {
            assert!(close(r.comm_hidden_share, hidden / all));
            assert!(close(r.devices[1].comm_hidden_share, 2.0 * hidden / all));
        }
    }
}

#[test]
fn dense_reports_serialise_as_before_and_comm_ones_say_it() {
    let dense = serde_json::to_string(&run(WITH_OVERLAP, &costs(0.0, 0.0))).unwrap();
    assert!(!dense.contains("comm"), "{dense}");
    let moe = serde_json::to_value(run(WITH_OVERLAP, &costs(0.5, 0.5))).unwrap();
    assert_eq!(moe["comm"], 4.0);
    assert_eq!(moe["comm_hidden"], 1.0);
    assert_eq!(moe["comm_hidden_share"], 0.25);
    assert_eq!(moe["devices"][1]["comm_hidden_share"], 0.5);
}

#[test]
fn a_measured_overlap_time_wins_over_the_closed_form() {
    let mut c = costs(0.5, 0.5);
    c.stages[1].overlap = Some(3.5);
    let r = run(WITH_OVERLAP, &c);
    assert!(close(r.makespan, 3.0 + 3.5 + 5.0), "{}", r.makespan);
    // 4 in a row, 3.5 measured: 0.5 of the 1.0 of comm hidden.
    assert!(close(r.comm_hidden, 0.5), "{}", r.comm_hidden);
}

#[test]
fn split_backward_i_pays_b_comm_w_none_and_r_repeats_f_comm() {
    let c = StageCost {
        f_comm: 0.25,
        b_comm: 0.5,
        ..StageCost::new(1.0, 2.0, Some(0.75)).unwrap()
    };
    use pipewright_schedule::ActionKind::*;
    assert_eq!(
        [c.of(F), c.of(B), c.of(I), c.of(W), c.of(R)],
        [1.25, 2.5, 1.75, 0.75, 1.25]
    );
    let half = c.split(2);
    assert_eq!((half.f_comm, half.b_comm), (0.125, 0.25));
    // A selective recompute reruns no dispatch: `r_comm` 0 charges R its compute alone.
    let selective = StageCost {
        r: Some(0.5),
        r_comm: Some(0.0),
        ..c
    };
    assert_eq!((selective.of(R), selective.split(2).of(R)), (0.5, 0.25));
}

#[test]
fn dualpipev_with_comm_runs_as_dense_costs_with_the_overlap_time_measured() {
    // The simulator sees only durations: comm costs must time DualPipeV exactly as dense
    // costs of F + f_comm, B + b_comm, I + b_comm, W and the closed form as measured overlap.
    let spec = ScheduleSpec::new(ScheduleKind::DualPipeV, 2, 2, 8, None).unwrap();
    let tt = Checked::new(generate(&spec)).unwrap();
    let (f, w, fm, bm) = (1.0, 0.75, 0.5, 1.25);
    let moe = StageCost {
        f_comm: fm,
        b_comm: bm,
        ..StageCost::new(f, 2.0, Some(w)).unwrap()
    };
    let dense = StageCost {
        overlap: Some(overlap_time((f, fm), (2.0, bm))),
        ..StageCost::new(f + fm, 2.0 + bm, Some(w)).unwrap()
    };
    let got = simulate(&tt, &CostModel::uniform(4, moe)).unwrap().report;
    let want = simulate(&tt, &CostModel::uniform(4, dense)).unwrap().report;
    assert!(
        close(got.makespan, want.makespan),
        "{} != {}",
        got.makespan,
        want.makespan
    );
    // Each overlap hides F + B - T = 1.5 + 3.25 - max(3, 1.75, 1.5, 3.25) = 1.5.
    let overlaps = tt
        .devices
        .iter()
        .flatten()
        .filter(|a| a.parts().count() == 2)
        .count();
    assert!(overlaps > 0);
    assert!(
        close(got.comm_hidden, 1.5 * overlaps as f64),
        "{}",
        got.comm_hidden
    );
    // Every chunk-microbatch pays fm + bm once: 4 stages x 8 microbatches.
    assert!(close(got.comm, 32.0 * (fm + bm)), "{}", got.comm);
}

#[test]
fn a_cost_file_with_negative_or_nan_comm_is_refused_naming_stage_and_field() {
    let e = CostModel::from_json(r#"{"default": {"f": 1, "b": 2, "f_comm": -1}}"#, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stage 0: f_comm must be a finite number >= 0 (got -1)"
    );
    let text = r#"{"default": {"f": 1, "b": 2}, "stages": [{}, {"b_comm": -0.5}]}"#;
    let e = CostModel::from_json(text, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stage 1: b_comm must be a finite number >= 0 (got -0.5)"
    );
    let raw = pipewright_sim::RawCostFile {
        default: pipewright_sim::RawStageCost {
            f: Some(1.0),
            b: Some(2.0),
            b_comm: Some(f64::NAN),
            ..Default::default()
        },
        ..Default::default()
    };
    let e = raw.resolve(1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stage 0: b_comm must be a finite number >= 0 (got NaN)"
    );
}

#[test]
fn a_cost_file_reads_comm_and_cutting_or_joining_stages_divides_or_sums_it() {
    let text = r#"{"default": {"f": 1, "b": 2, "f_comm": 0.5}, "stages": [{}, {"b_comm": 1}]}"#;
    let two = CostModel::from_json(text, 2).unwrap();
    let comm = |m: &CostModel| -> Vec<(f64, f64)> {
        m.stages.iter().map(|c| (c.f_comm, c.b_comm)).collect()
    };
    assert_eq!(comm(&two), [(0.5, 0.0), (0.5, 1.0)]);
    let four = CostModel::from_json(text, 4).unwrap();
    assert_eq!(
        comm(&four),
        [(0.25, 0.0), (0.25, 0.0), (0.25, 0.5), (0.25, 0.5)]
    );
    assert_eq!(comm(&CostModel::from_json(text, 1).unwrap()), [(1.0, 1.0)]);
    // Written back, dense stages say nothing of it; these say exactly what they have.
    let dense = serde_json::to_string(&StageCost::new(1.0, 2.0, None).unwrap()).unwrap();
    assert!(!dense.contains("comm"), "{dense}");
    let moe = serde_json::to_string(&two.stages[1]).unwrap();
    assert!(moe.contains(r#""f_comm":0.5,"b_comm":1.0"#), "{moe}");
}

#[test]
fn steady_state_steps_pay_comm_as_one_step_does() {
    use pipewright_sim::simulate::simulate_steps;
    // 1F1B's period with all-to-all equals its period with dense costs of F + f_comm and
    // B + b_comm: the multi-step simulation times actions as one step does.
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 3, 1, 6, None).unwrap();
    let tt = Checked::new(generate(&spec)).unwrap();
    let moe = StageCost {
        f_comm: 0.5,
        b_comm: 0.75,
        optimizer: 0.25,
        ..StageCost::new(1.0, 2.0, None).unwrap()
    };
    let dense = StageCost {
        optimizer: 0.25,
        ..StageCost::new(1.5, 2.75, None).unwrap()
    };
    let got = simulate_steps(&tt, &CostModel::uniform(3, moe), 3).unwrap();
    let want = simulate_steps(&tt, &CostModel::uniform(3, dense), 3).unwrap();
    assert!(close(got.report.period, want.report.period));
    assert!(got.report.period > 6.0 * 3.0, "{}", got.report.period);
}
