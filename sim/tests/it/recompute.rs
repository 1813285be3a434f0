//! Recomputation in the IR: `R` actions in text, in the validator, in the simulator's time
//! and memory.

use pipewright_schedule::recompute::{insert, recomputed};
use pipewright_schedule::Checked;
use pipewright_schedule::{
    from_csv, generate, to_csv, validate, Action, ActionKind, Problem, ScheduleKind, ScheduleSpec,
    Timetable,
};
use pipewright_sim::{simulate, CostModel, StageCost};

fn schedule(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, p, v, m, None).unwrap())
}

fn full(tt: &Timetable) -> Timetable {
    insert(tt, &"full".parse().unwrap())
}

#[test]
fn r_reads_and_writes_as_pytorch_text_and_round_trips_through_csv() {
    let a: Action = "2R3".parse().unwrap();
    assert_eq!(a, Action::new(2, ActionKind::R, 3));
    assert_eq!(a.to_string(), "2R3");
    // RECV_F still parses as a receive, not as an R.
    assert_eq!(
        "1RECV_F0".parse::<Action>().unwrap().kind,
        ActionKind::RecvF
    );
    let tt = full(&schedule(ScheduleKind::ZbH1, 2, 1, 3));
    let (back, _) = from_csv(&to_csv(&tt)).unwrap();
    assert_eq!(back.devices, tt.devices);
}

#[test]
fn insert_puts_one_r_right_before_each_first_backward_and_every_family_stays_valid() {
    for (kind, p, v) in [
        (ScheduleKind::OneFOneB, 4, 1),
        (ScheduleKind::Interleaved1F1B, 2, 2),
        (ScheduleKind::ZbH1, 4, 1),
        (ScheduleKind::Zbv, 2, 2),
        (ScheduleKind::DualPipeV, 2, 2),
    ] {
        let tt = schedule(kind, p, v, 4);
        let with = full(&tt);
        validate(&with).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let rs = with.devices.iter().flatten();
        assert_eq!(
            rs.filter(|a| a.kind == ActionKind::R).count(),
            4 * (p * v) as usize
        );
        for row in &with.devices {
            for (i, a) in row
                .iter()
                .enumerate()
                .filter(|(_, a)| a.kind == ActionKind::R)
            {
                let next = row[i + 1].parts().find(|q| q.kind.is_input_backward());
                assert_eq!(
                    next.map(|q| (q.stage, q.microbatch)),
                    Some((a.stage, a.microbatch))
                );
            }
        }
        // Only the named stages get one; inserting twice changes nothing.
        let some = insert(&tt, &"1:full".parse().unwrap());
        assert_eq!(recomputed(&some).into_iter().collect::<Vec<_>>(), vec![1]);
        assert_eq!(full(&with), with);
    }
}

#[test]
fn the_validator_names_an_r_before_its_forward_or_after_its_backward() {
    // 2 devices, 1 microbatch: device 0 runs 0F0 0B0, device 1 runs 1F0 1B0.
    let tt = schedule(ScheduleKind::OneFOneB, 2, 1, 1);
    let r = Action::new(1, ActionKind::R, 0);
    let mut early = tt.clone();
    early.devices[1].insert(0, r);
    let e = validate(&early).unwrap_err();
    assert!(
        matches!(e.problem, Problem::RecomputeBeforeForward { .. }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "device 1, step 0 (1R0): recompute before its forward 1F0 (step 1)"
    );
    let mut late = tt.clone();
    late.devices[1].push(r);
    let e = validate(&late).unwrap_err().to_string();
    assert!(
        e.starts_with("device 1, step 2 (1R0): recompute after its backward 1B0 (step 1)"),
        "{e}"
    );
    let mut elsewhere = tt.clone();
    elsewhere.devices[0].insert(1, r);
    let e = validate(&elsewhere).unwrap_err().to_string();
    assert_eq!(
        e,
        "device 0, step 1 (1R0): stage 1 lives on device 1, not here"
    );
    let mut twice = full(&tt);
    twice.devices[1].insert(1, r);
    assert!(validate(&twice).is_err());
}

fn costs(p: u32, r: f64) -> CostModel {
    let mut c = StageCost::new(1.0, 2.0, None).unwrap();
    c.r = Some(r);
    c.activation_bytes = 1000;
    c.p2p_bytes = 10;
    CostModel::uniform(p, c)
}

#[test]
fn recompute_lengthens_1f1b_by_m_times_r_exactly() {
    // Uniform costs: the last device runs every microbatch's F, R and B back to back, while
    // every other device's R fits in its wait for the gradient, so the step is
    // (m + p - 1)(f + b) + m * r.
    let (f, b) = (1.0, 2.0);
    for (p, m) in [(2u32, 2u32), (2, 5), (4, 4), (4, 8), (3, 7)] {
        for r in [0.5, 1.0, 1.75] {
            let tt = schedule(ScheduleKind::OneFOneB, p, 1, m);
            let base = simulate(&Checked::new(tt.clone()).unwrap(), &costs(p, r))
                .unwrap()
                .report
                .makespan;
            let with = simulate(&Checked::new(full(&tt)).unwrap(), &costs(p, r))
                .unwrap()
                .report
                .makespan;
            let closed = f64::from(m + p - 1) * (f + b);
            assert!((base - closed).abs() < 1e-9, "p={p} m={m}: {base}");
            let want = closed + f64::from(m) * r;
            assert!(
                (with - want).abs() < 1e-9,
                "p={p} m={m} r={r}: {with} vs {want}"
            );
        }
    }
    // By default a recompute costs a forward.
    let tt = schedule(ScheduleKind::OneFOneB, 4, 1, 8);
    let uniform = CostModel::uniform(4, StageCost::new(f, b, None).unwrap());
    let with = simulate(&Checked::new(full(&tt)).unwrap(), &uniform)
        .unwrap()
        .report
        .makespan;
    assert!((with - (11.0 * 3.0 + 8.0 * f)).abs() < 1e-9, "{with}");
}

#[test]
fn full_recompute_lowers_the_simulated_peak_to_the_inputs_and_one_whole_stash() {
    // 1F1B, p = 4: device r holds 4 - r microbatches. With R right before each backward it
    // holds the others' inputs (the previous stage's 10-byte hand-off; token ids on device
    // 0, not counted) and the one it is about to run backward on.
    let tt = schedule(ScheduleKind::OneFOneB, 4, 1, 8);
    let none = simulate(&Checked::new(tt.clone()).unwrap(), &costs(4, 1.0))
        .unwrap()
        .report;
    let with = simulate(&Checked::new(full(&tt)).unwrap(), &costs(4, 1.0))
        .unwrap()
        .report;
    let peaks = |r: &pipewright_sim::Report| {
        r.devices
            .iter()
            .map(|d| d.peak_activation_bytes)
            .collect::<Vec<_>>()
    };
    assert_eq!(peaks(&none), [4000, 3000, 2000, 1000]);
    assert_eq!(peaks(&with), [1000, 2 * 10 + 1000, 10 + 1000, 1000]);
    for (n, w) in none.devices.iter().zip(&with.devices) {
        assert!(w.peak_activation_bytes <= n.peak_activation_bytes);
        assert_eq!(
            w.peak_activations, n.peak_activations,
            "counts are unchanged"
        );
    }
    // The first stage's input is token ids: it keeps nothing counted unless told.
    assert_eq!(costs(4, 1.0).kept_bytes(0), 0);
}
