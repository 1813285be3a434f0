//! Host time in the simulator: each action's and each message's time on the compute thread,
//! charged where the runtime spends it, against hand-derived timings.

use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, Timetable};
use pipewright_sim::simulate::{measured_costs_with, simulate_steps, HostCosts, Runtime};
use pipewright_sim::{simulate, CostModel, RawCostFile, Simulation, StageCost};

fn tt(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, p, v, m, None).unwrap())
}

/// One device's share F = 1, B = 2 per microbatch, over `stages / 2` chunks per device when
/// `chunks` says so.
fn costs(stages: u32, latency: f64, host: Option<HostCosts>) -> CostModel {
    costs_v(stages, 1, latency, host)
}

fn costs_v(stages: u32, v: u32, latency: f64, host: Option<HostCosts>) -> CostModel {
    let share = StageCost::new(1.0, 2.0, None).unwrap().split(v);
    let mut c = CostModel::uniform(stages, share)
        .with_link(latency, None)
        .unwrap();
    c.host = host;
    c
}

fn host(runtime: Runtime, action: f64, send: f64, recv: f64, other: f64) -> HostCosts {
    HostCosts {
        runtime,
        action,
        send,
        recv,
        other,
        ..HostCosts::default()
    }
}

fn sim(t: &Timetable, c: &CostModel) -> Simulation {
    simulate(&Checked::new(t.clone()).unwrap(), c).unwrap()
}

#[test]
fn one_microbatch_over_two_devices_pays_each_host_time_where_it_is_spent() {
    // pipewright's lowering, p=2, m=1, f=1, b=2, action a, send s, recv r, latency L:
    // device 0 takes F (a), computes (f), posts its send (s); the data lands L later, when
    // device 1 (which posted its receive, r, and took its F, a, meanwhile) starts F; it takes
    // B (a), runs it, posts the send (s); L later device 0, long done taking its B (its a
    // overlaps the wait), starts it. The step starts with device 1's posting, at 0.
    let (a, s, r, l) = (0.1, 0.2, 0.05, 0.5);
    let c = costs(2, l, Some(host(Runtime::Pipewright, a, s, r, 0.0)));
    let got = sim(&tt(ScheduleKind::OneFOneB, 2, 1, 1), &c)
        .report
        .makespan;
    let want = 2.0 * a + 2.0 * 1.0 + 2.0 * 2.0 + 2.0 * s + 2.0 * l;
    assert!((got - want).abs() < 1e-12, "{got} != {want}");
}

#[test]
fn zero_host_time_in_either_runtime_times_a_step_as_no_host_model() {
    // Where receives are posted changes nothing when posting is free: PyTorch's order and
    // pipewright's give the plain simulator's step, for every family.
    let cases = [
        (ScheduleKind::GPipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Zbv, 2),
        (ScheduleKind::DualPipeV, 2),
    ];
    for (kind, v) in cases {
        let t = tt(kind, 4, v, 8);
        let plain = sim(&t, &costs(4 * v, 0.3, None)).report.makespan;
        for runtime in [Runtime::Pipewright, Runtime::Pytorch] {
            let zero = costs(4 * v, 0.3, Some(host(runtime, 0.0, 0.0, 0.0, 0.0)));
            let got = sim(&t, &zero).report.makespan;
            assert!(
                (got - plain).abs() < 1e-9,
                "{kind:?} {runtime:?}: {got} != {plain}"
            );
        }
    }
}

#[test]
fn posting_messages_makes_interleaving_pay_for_its_extra_hand_offs() {
    // With compute alone, interleaved (v=2) beats 1F1B; once each message costs host time on
    // the compute thread (PyTorch's runtime on CPU), its twice as many hand-offs can undo that.
    let one = tt(ScheduleKind::OneFOneB, 2, 1, 8);
    let inter = tt(ScheduleKind::Interleaved1F1B, 2, 2, 8);
    let free = |t: &Timetable, v| sim(t, &costs_v(2 * v, v, 0.0, None)).report.makespan;
    assert!(free(&inter, 2) < free(&one, 1));
    let h = Some(host(Runtime::Pytorch, 0.0, 0.4, 0.4, 0.0));
    let paid = |t: &Timetable, v| sim(t, &costs_v(2 * v, v, 0.0, h)).report.makespan;
    assert!(paid(&inter, 2) > paid(&one, 1));
}

#[test]
fn pytorch_own_ops_are_charged_one_each() {
    // PyTorch's row starts with an UNSHARD of the rank's stage: the first forward is taken
    // after it. Its REDUCE_GRAD, waits and RESHARDs end the row, after the last compute.
    let t = tt(ScheduleKind::OneFOneB, 2, 1, 2);
    let h = Some(host(Runtime::Pytorch, 0.0, 0.0, 0.0, 0.125));
    let step = sim(&t, &costs(2, 0.0, h));
    let first = step.timeline.events.iter().find(|e| e.device == 0).unwrap();
    assert_eq!(
        (first.action.to_string(), first.start),
        ("0F0".to_string(), 0.125)
    );
}

#[test]
fn many_steps_charge_the_trailing_ops_before_the_next_step() {
    // 1F1B's device 0 runs the first and the last compute of a step, and its own ops (an
    // UNSHARD first, REDUCE_GRAD and RESHARD last; the waits are not charged) all sit at the
    // ends of its row: each step's period grows by exactly those ops' time.
    use pipewright_schedule::formats::pytorch::{compute_comms, Op};
    let t = tt(ScheduleKind::OneFOneB, 2, 1, 4);
    let own = compute_comms(&t).unwrap()[0]
        .iter()
        .filter(|op| matches!(op, Op::Unshard(_) | Op::Reshard(_) | Op::ReduceGrad(_)))
        .count() as f64;
    assert!(own >= 2.0, "{own}");
    let c0 = costs(2, 0.0, Some(host(Runtime::Pytorch, 0.0, 0.0, 0.0, 0.0)));
    let c1 = costs(2, 0.0, Some(host(Runtime::Pytorch, 0.0, 0.0, 0.0, 0.5)));
    let p0 = simulate_steps(&Checked::new(t.clone()).unwrap(), &c0, 4)
        .unwrap()
        .report
        .period;
    let p1 = simulate_steps(&Checked::new(t.clone()).unwrap(), &c1, 4)
        .unwrap()
        .report
        .period;
    assert!(
        (p1 - p0 - 0.5 * own).abs() < 1e-9,
        "{p1} - {p0} != 0.5 * {own}"
    );
}

#[test]
fn measured_latency_is_in_transit_once_the_send_is_charged() {
    // A step simulated with host time measures back its link latency: the hand-off seen by a
    // waiting consumer less the posting of the send.
    let (s, l) = (0.2, 0.5);
    let h = host(Runtime::Pytorch, 0.05, s, 0.05, 0.0);
    let step = sim(&tt(ScheduleKind::OneFOneB, 2, 1, 4), &costs(2, l, Some(h)));
    let raw = measured_costs_with(&[&step.timeline], &[], Some(h)).unwrap();
    let got = raw.p2p_latency.unwrap();
    assert!((got - l).abs() < 1e-9, "{got} != {l}");
    assert_eq!(raw.host, Some(h));
}

#[test]
fn a_probe_gives_the_split_backward_beside_the_fused_one() {
    // 1F1B measures b; a zb-h1 probe on the same stages measures i and w. In PyTorch's
    // runtime the file keeps all three, as measured, and a split schedule is timed by i + w.
    let h = host(Runtime::Pytorch, 0.0, 0.0, 0.0, 0.0);
    let mut fused = costs(2, 0.0, Some(h));
    let one = sim(&tt(ScheduleKind::OneFOneB, 2, 1, 4), &fused);
    for st in &mut fused.stages {
        (st.i, st.w) = (1.5, 1.25); // I + W = 2.75 > B = 2
    }
    let probe = sim(&tt(ScheduleKind::ZbH1, 2, 1, 4), &fused);
    let raw = measured_costs_with(&[&one.timeline], &[&probe.timeline], Some(h)).unwrap();
    let stage = raw.stages.as_ref().unwrap()[0];
    assert_eq!(
        (stage.b, stage.i, stage.w),
        (Some(2.0), Some(1.5), Some(1.25))
    );
    let model = raw.resolve(2).unwrap();
    assert_eq!(
        (model.stages[1].b, model.stages[1].i + model.stages[1].w),
        (2.0, 2.75)
    );
}

#[test]
fn a_cost_file_whose_split_does_not_add_up_is_refused_unless_measured_apart() {
    let text = r#"{"default": {"f": 1, "b": 2, "i": 0.5, "w": 0.5}}"#;
    let e = serde_json::from_str::<RawCostFile>(text)
        .unwrap()
        .resolve(2)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stage 0: i + w = 0.5 + 0.5 is not b = 2: a split backward (I then W) does the fused \
         backward's work, so give two of the three and the third follows (only a cost file \
         measured in PyTorch's runtime, \"host\": {\"runtime\": \"pytorch\"}, times them apart)"
    );
    let apart = r#"{"default": {"f": 1, "b": 2, "i": 1.5, "w": 1.5},
                    "host": {"runtime": "pytorch", "send": 0.1}}"#;
    let model = serde_json::from_str::<RawCostFile>(apart)
        .unwrap()
        .resolve(2)
        .unwrap();
    assert_eq!(model.host.unwrap().send, 0.1);
    let bad = r#"{"default": {"f": 1, "b": 2}, "host": {"runtime": "pytorch", "send": -1}}"#;
    let e = serde_json::from_str::<RawCostFile>(bad)
        .unwrap()
        .resolve(2)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "host.send must be a finite number >= 0 (got -1)"
    );
    let typo = r#"{"default": {"f": 1, "b": 2}, "host": {"runtime": "torch"}}"#;
    assert!(serde_json::from_str::<RawCostFile>(typo).is_err());
}

#[test]
fn a_measured_fixed_part_of_each_action_is_paid_once_by_every_piece() {
    // A forward of 2.3 of which 0.3 is the runtime's own per call: cut in two, each piece
    // does half the work (1.0) and pays the whole call (0.3); joined back, 2.3 again.
    use pipewright_sim::simulate::CallCosts;
    let text = r#"{"default": {"f": 2.3, "b": 4.4, "i": 2.5, "w": 2.4},
                   "host": {"runtime": "pytorch", "call": {"f": 0.3, "b": 0.4, "i": 0.5, "w": 3}}}"#;
    let raw: RawCostFile = serde_json::from_str(text).unwrap();
    let two = raw.resolve(2).unwrap();
    assert_eq!(
        two.host.unwrap().call,
        CallCosts {
            f: 0.3,
            b: 0.4,
            i: 0.5,
            w: 3.0
        }
    );
    let four = two.resample(4).unwrap();
    let s = four.stages[0];
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(
        close(s.f, 1.3) && close(s.b, 2.4) && close(s.i, 1.5),
        "{s:?}"
    );
    // A fixed part larger than the time is the whole time: nothing left to split.
    assert!(close(s.w, 2.4), "{s:?}");
    let back = four.resample(2).unwrap().stages[0];
    assert!(
        close(back.f, 2.3) && close(back.b, 4.4) && close(back.i, 2.5),
        "{back:?}"
    );
    // Without it, the old even split.
    let bare = CostModel {
        host: None,
        ..two.clone()
    }
    .resample(4)
    .unwrap()
    .stages[0]
        .f;
    assert!(close(bare, 1.15), "{bare}");
}
