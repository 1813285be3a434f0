//! `simulate --steps`, `viz --steps` and `search --objective` end to end: the steady state
//! next to the single step, under names a program can read.

use crate::common;

use common::ok;

/// The zero-bubble paper's costs (F, B = I + W, W, c) for zb-h2 at p = 8, m = 24.
const PAPER: [&str; 11] = [
    "simulate",
    "--schedule",
    "zb-h2",
    "-p",
    "8",
    "-m",
    "24",
    "--cost",
    "29.718,49.371,19.927",
    "--p2p-latency",
    "0.527",
];

fn pct(x: &serde_json::Value) -> f64 {
    (x.as_f64().unwrap() * 10000.0).round() / 100.0
}

#[test]
fn simulate_steps_json_names_both_bubbles_and_gives_the_papers_figure() {
    let out = ok(&[&PAPER[..], &["--steps", "4", "--format", "json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["steps"], 4);
    assert_eq!(pct(&v["single_step"]["bubble_fraction"]), 10.03);
    assert_eq!(pct(&v["largest_span"]["bubble_fraction"]), 6.98);
    let period = v["steady_state"]["period"].as_f64().unwrap();
    let makespan = v["single_step"]["makespan"].as_f64().unwrap();
    assert!(period < makespan);
    assert_eq!(
        v["steady_state"]["step_makespans"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_eq!(v["devices"].as_array().unwrap().len(), 8);
    // The one-step report is unchanged without --steps.
    let one: serde_json::Value =
        serde_json::from_str(&ok(&[&PAPER[..], &["--format", "json"]].concat())).unwrap();
    assert_eq!(one["makespan"].as_f64().unwrap(), makespan);
}

#[test]
fn simulate_steps_table_and_timeline_hold_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("tl.json");
    let out = ok(&[
        "simulate",
        "--schedule",
        "1f1b",
        "-p",
        "4",
        "-m",
        "8",
        "--steps",
        "3",
        "--timeline",
        tl.to_str().unwrap(),
    ]);
    // 1F1B: period = makespan = (m + p - 1)(F + B) = 33.
    assert!(
        out.contains("single step:  makespan     33.000  bubble  27.27%"),
        "{out}"
    );
    assert!(
        out.contains("steady state: period       33.000  bubble  27.27%"),
        "{out}"
    );
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tl).unwrap()).unwrap();
    assert_eq!(t["meta"]["microbatches"], 24);
    let computes = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"]["kind"] == "F" || e["action"]["kind"] == "B")
        .count();
    assert_eq!(computes, 3 * 2 * 4 * 8);
}

#[test]
fn viz_steps_draws_every_step_and_bad_counts_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("s.svg");
    ok(&[
        "viz",
        "--schedule",
        "zb-h1",
        "-p",
        "4",
        "-m",
        "8",
        "--steps",
        "3",
        "-o",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") || text.starts_with("<?xml"));
    // 3 steps x 4 stages x 8 microbatches: one box per F, I and W of every step.
    for kind in ["F", "I", "W"] {
        assert_eq!(
            text.matches(&format!(r#"class="act {kind}""#)).count(),
            96,
            "{kind}"
        );
    }
    for args in [
        &["simulate", "--steps", "0"][..],
        &["viz", "--steps", "1001"][..],
    ] {
        let o = common::run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--steps must be between 1 and 1000 (got"),
            "{err}"
        );
    }
}

#[test]
fn search_objective_is_period_or_makespan_and_nothing_else() {
    let base = [
        "search",
        "-p",
        "4",
        "-m",
        "8",
        "--memory-cap",
        "4",
        "--cost",
        "1,2,1",
        "--format",
        "json",
    ];
    for (name, field) in [("period", "period"), ("makespan", "makespan")] {
        let out = ok(&[&base[..], &["--objective", name]].concat());
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["objective"], name);
        let best = v["best"][field].as_f64().unwrap();
        let fixed = v["best_fixed"][field].as_f64().unwrap();
        assert!(best <= fixed + 1e-12, "{name}: {best} > {fixed}");
    }
    let o = common::run(&[&base[..], &["--objective", "speed"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("expected `period`"), "{err}");
}

/// Synthetic stages sleep their exact durations, so a measured period can exceed the
/// simulated one (overhead) but not fall short of it by more than timer noise.
#[test]
fn bench_and_train_report_the_measured_period() {
    let out = ok(&[
        "bench",
        "--schedule",
        "zbv",
        "-v",
        "2",
        "-p",
        "2",
        "-m",
        "4",
        "--cost",
        "1,2",
        "--steps",
        "5",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["steady_state"];
    let simulated = s["simulated_period_ms"].as_f64().unwrap();
    let measured = s["measured_period_ms"].as_f64().unwrap();
    assert!(simulated > 0.0 && measured >= 0.97 * simulated, "{s}");
    assert!((s["ratio"].as_f64().unwrap() - measured / simulated).abs() < 1e-12);
    let out = ok(&[
        "train",
        "--schedule",
        "1f1b",
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--format",
        "json",
    ]);
    let periods: Vec<serde_json::Value> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["steady_state_period_ms"].clone()
        })
        .collect();
    assert_eq!(periods.len(), 3);
    assert!(periods[0].is_null(), "one step has no period");
    assert!(periods[1].as_f64().unwrap() > 0.0 && periods[2].as_f64().unwrap() > 0.0);
}
