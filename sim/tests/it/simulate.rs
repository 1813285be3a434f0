//! The simulator against hand-derived timings: communication, uneven stages, memory, traces.

use pipewright_schedule::Checked;
use pipewright_schedule::{chrome_trace, generate, ActionKind, ScheduleKind, ScheduleSpec};
use pipewright_sim::{simulate, CostModel, RawCostFile, Simulation, StageCost};

fn sim(kind: ScheduleKind, p: u32, v: u32, m: u32, costs: &CostModel) -> Simulation {
    let spec = ScheduleSpec::new(kind, p, v, m, None).unwrap();
    simulate(&Checked::new(generate(&spec)).unwrap(), costs).unwrap()
}

fn uniform(stages: u32) -> CostModel {
    CostModel::uniform(stages, StageCost::new(1.0, 2.0, None).unwrap())
}

#[test]
fn latency_and_bandwidth_delay_each_hop() {
    // p=2, m=1: F0 | send | F1 B1 | send | B0 = 1 + 2 + 2 + 2 transfers.
    let mut costs = uniform(2).with_link(0.25, Some(100.0)).unwrap();
    costs.stages[0].p2p_bytes = 50; // 0.5 time units at 100 bytes per unit
    let s = sim(ScheduleKind::OneFOneB, 2, 1, 1, &costs);
    assert!(
        (s.report.makespan - (6.0 + 2.0 * 0.75)).abs() < 1e-12,
        "{}",
        s.report.makespan
    );
    let send = s
        .timeline
        .events
        .iter()
        .find(|e| e.action.kind == ActionKind::SendF)
        .unwrap();
    assert_eq!((send.device, send.start, send.end), (0, 1.0, 1.75));
    let recv = s
        .timeline
        .events
        .iter()
        .find(|e| e.action.kind == ActionKind::RecvF)
        .unwrap();
    assert_eq!((recv.device, recv.start, recv.end), (1, 1.0, 1.75));
}

#[test]
fn a_heavier_last_stage_sets_the_pace() {
    // Last stage F=2, B=4; others F=1, B=2. 1F1B keeps the last stage busy once the first
    // microbatch arrives: (p-1) forwards in, m*(F+B) on the last stage, (p-1) backwards out.
    let (p, m) = (4, 8);
    let mut costs = uniform(p);
    costs.stages[p as usize - 1] = StageCost::new(2.0, 4.0, None).unwrap();
    let s = sim(ScheduleKind::OneFOneB, p, 1, m, &costs);
    assert_eq!(s.report.makespan, 3.0 + 6.0 * 8.0 + 6.0);
    assert_eq!(s.report.ideal, 48.0);
    assert_eq!(s.report.devices[3].bubble_fraction, 1.0 - 48.0 / 57.0);
}

#[test]
fn stashed_bytes_follow_in_flight_microbatches() {
    let mut costs = uniform(4);
    for c in &mut costs.stages {
        c.activation_bytes = 1000;
    }
    let s = sim(ScheduleKind::OneFOneB, 4, 1, 8, &costs);
    for (r, d) in s.report.devices.iter().enumerate() {
        assert_eq!(d.peak_activation_bytes, 1000 * (4 - r as u64));
        assert_eq!(d.memory.last().unwrap().bytes, 0, "all freed at the end");
    }
}

#[test]
fn cost_file_overrides_per_stage_and_reports_bad_fields_with_position() {
    let text = r#"{"default": {"f": 1, "b": 2}, "stages": [{}, {"f": 3, "b": 6, "w": 2}], "p2p_latency": 0.5}"#;
    let c = CostModel::from_json(text, 2).unwrap();
    assert_eq!(
        (c.stages[1].f, c.stages[1].i, c.stages[1].w),
        (3.0, 4.0, 2.0)
    );
    assert_eq!((c.stages[0].i, c.p2p_latency), (1.0, 0.5));
    let e = CostModel::from_json(text, 3).unwrap_err().to_string();
    assert_eq!(e, "cost file lists 2 stages, but the timetable has 3 (one count must divide the other: the list is cut or joined evenly)");
    // Two listed stages serve a 4-stage timetable: each is cut in two halves.
    let c4 = CostModel::from_json(text, 4).unwrap();
    assert_eq!(
        (c4.stages[1].f, c4.stages[2].f, c4.stages[3].b),
        (0.5, 1.5, 3.0)
    );
    let e = CostModel::from_json("{\n  \"defualt\": {}\n}", 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cost file, line 2, column 11: unknown field `defualt`"),
        "{e}"
    );
    let e = RawCostFile::default().resolve(1).unwrap_err().to_string();
    assert_eq!(e, "stage 0: no f given");
}

#[test]
fn chrome_trace_has_a_track_per_device_and_an_arrow_per_transfer() {
    let s = sim(ScheduleKind::Interleaved1F1B, 2, 2, 4, &uniform(4));
    let trace = chrome_trace(&s.timeline);
    let events = trace["traceEvents"].as_array().unwrap();
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    let recvs = s.timeline.count(ActionKind::RecvF) + s.timeline.count(ActionKind::RecvB);
    assert_eq!(
        recvs,
        3 * 4 * 2,
        "3 cross-device boundaries, 4 microbatches, both ways"
    );
    assert_eq!(count("s"), recvs);
    assert_eq!(count("f"), recvs);
    assert_eq!(count("X"), s.timeline.events.len());
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["device 0", "device 0 comm", "device 1", "device 1 comm"]
    );
}

#[test]
fn report_json_carries_the_documented_fields() {
    let s = sim(ScheduleKind::GPipe, 3, 1, 5, &uniform(3));
    let v = serde_json::to_value(&s.report).unwrap();
    for key in ["makespan", "ideal", "bubble_fraction"] {
        assert!(v[key].is_number(), "{key}");
    }
    assert_eq!(v["devices"][2]["peak_activations"], 5);
    assert!((v["devices"][1]["bubble_fraction"].as_f64().unwrap() - 2.0 / 7.0).abs() < 1e-12);
}

#[test]
fn resampling_costs_keeps_the_model_and_makes_the_same_step() {
    let mut costs = uniform(4);
    for (s, c) in costs.stages.iter_mut().enumerate() {
        c.f = 1.0 + s as f64;
        c.activation_bytes = 100 * (s as u64 + 1);
        c.p2p_bytes = 7 + s as u64;
    }
    let joined = costs.resample(2).unwrap();
    assert_eq!((joined.stages[0].f, joined.stages[1].f), (3.0, 7.0));
    assert_eq!(joined.stages[1].activation_bytes, 700);
    assert_eq!(
        joined.stages[0].p2p_bytes, 8,
        "a joined stage hands off its last piece's output"
    );
    let cut = joined.resample(8).unwrap();
    let total = |c: &CostModel| c.stages.iter().map(|s| s.f + s.b).sum::<f64>();
    assert!(
        (total(&cut) - total(&costs)).abs() < 1e-12,
        "cutting keeps the model's total time"
    );
    let e = costs.resample(6).unwrap_err().to_string();
    assert_eq!(
        e,
        "costs of 4 stages cannot be cut into 6 stages (one count must divide the other)"
    );
    // A 2-device cost model drives interleaving v=2 on 2 devices: same total work per device.
    let s = sim(
        ScheduleKind::Interleaved1F1B,
        2,
        2,
        4,
        &uniform(2).resample(4).unwrap(),
    );
    let plain = sim(ScheduleKind::OneFOneB, 2, 1, 4, &uniform(2));
    assert!((s.report.ideal - plain.report.ideal).abs() < 1e-12);
}

/// A cost model written as a cost file (a planner's prediction, `plan --costs-out`) resolves
/// to the same model: every field of every stage, the all-to-all and overrides included.
#[test]
fn a_cost_model_round_trips_through_its_cost_file() {
    use pipewright_sim::simulate::{CostModel, RawCostFile, StageCost};
    let stage = |k: f64| StageCost {
        f: 1.0 * k,
        b: 2.5 * k,
        i: 1.5 * k,
        w: 1.0 * k,
        f_comm: 0.25,
        b_comm: 0.5,
        activation_bytes: 4096,
        w_memory: 0.4,
        p2p_bytes: 1024,
        p2p_time: Some(0.01),
        overlap: Some(3.0),
        optimizer: 0.2,
        dp_allreduce: 0.3,
        r: Some(0.9),
        r_comm: Some(0.0),
        kept_bytes: Some(512),
    };
    let dense = StageCost::new(1.0, 2.0, None).unwrap();
    let model = CostModel {
        stages: vec![stage(1.0), stage(1.5), dense],
        p2p_latency: 0.05,
        bandwidth: Some(1e9),
        host: None,
    };
    let file = RawCostFile::from_model(&model, "s", "test".into());
    let text = serde_json::to_string(&file).unwrap();
    let read: RawCostFile = serde_json::from_str(&text).unwrap();
    assert_eq!(read.resolve(3).unwrap(), model);
    assert_eq!(read.time_unit.as_deref(), Some("s"));
}

/// Uniform costs are a field (`cost`): the CLI writes it `--cost`, another face its own way;
/// a cost file's stage stays in words.
#[test]
fn a_cost_refusal_names_its_field_each_face_writes_its_way() {
    let e = StageCost::new(1.0, 2.0, Some(3.0)).unwrap_err();
    let line = e.to_string();
    assert!(
        line.starts_with("--cost: w = 3 is larger than b = 2"),
        "{line}"
    );
    let python = e.named(|f| {
        if f == "cost" {
            "Costs".into()
        } else {
            f.into()
        }
    });
    assert_eq!(python, line.replacen("--cost", "Costs", 1));
    let e = StageCost::new(-1.0, 2.0, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--cost: f must be a finite number >= 0 (got -1)"
    );
    let e = CostModel::from_json(r#"{"stages": [{"f": 1, "b": 2}, {"f": -1, "b": 2}]}"#, 2)
        .unwrap_err();
    assert_eq!(e.named(|f| f.to_string()), e.to_string());
    assert!(e.to_string().starts_with("stage 1: f must be"), "{e}");
}
