//! `plan` with a searched best end to end: `--timetable-out` writes a timetable that
//! validates, and the launch line's `train --timetable` runs it (the reference GPT,
//! in-process).

use std::path::Path;

use crate::common;

fn ok(dir: &Path, args: &[&str]) -> String {
    common::ok_in(Some(dir), args)
}

/// A GPT small enough to train here, on 4 GPUs of a cluster whose links are slow next to its
/// compute: the list scheduler's order beats every generator family there.
const MODEL: [&str; 10] = [
    "--layers",
    "8",
    "--d-model",
    "64",
    "--heads",
    "2",
    "--seq-len",
    "16",
    "--vocab",
    "64",
];

fn cluster(dir: &Path) -> String {
    let path = dir.join("c.json");
    std::fs::write(
        &path,
        r#"{ "name": "small", "gpus_per_node": 8, "memory_gib": 0.05,
             "peak_tflops": { "bf16": 100, "tf32": 50, "f32": 10 },
             "memory_bandwidth_gbs": 900,
             "intra_node": { "bandwidth_gbs": 50, "latency_us": 5 },
             "inter_node": { "bandwidth_gbs": 10, "latency_us": 10 } }"#,
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

fn plan_args<'a>(cluster: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "--cluster", cluster];
    args.extend(MODEL);
    args.extend([
        "--gpus",
        "4",
        "--global-batch",
        "16",
        "--tp",
        "1",
        "--pp",
        "4",
        "--microbatch-size",
        "1",
        "--precision",
        "f32",
    ]);
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_searched_best_is_written_and_its_launch_line_trains() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = cluster(d);
    let out = ok(
        d,
        &plan_args(&c, &["--explain", "--timetable-out", "best.csv"]),
    );
    let best = out
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no first row in {out}"));
    assert!(best.contains(" searched (list "), "{out}");
    assert!(out.contains("search: its timetable ("), "{out}");
    let launch = out
        .lines()
        .find(|l| l.trim_start().starts_with("mpirun -np 4 pipewright train"))
        .unwrap_or_else(|| panic!("no launch line in {out}"));
    assert!(
        launch.contains(" --timetable best.csv ") && !launch.contains("--schedule"),
        "{launch}"
    );
    // Every flag of the launch line is one `train` knows.
    let help = ok(d, &["train", "--help"]);
    for flag in launch.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "train has no {flag}");
    }
    ok(d, &["validate", "best.csv"]);
    // The launch line's training flags, in-process instead of over NCCL.
    let mut train = vec!["train", "--timetable", "best.csv", "--steps", "2"];
    train.extend(MODEL);
    train.extend(["--microbatch-size", "1", "--recompute", "none"]);
    let trained = ok(d, &train);
    assert!(trained.contains("2 steps, loss"), "{trained}");
    // JSON carries the searched row and the same launch.
    let json = ok(
        d,
        &plan_args(&c, &["--format", "json", "--timetable-out", "best.json"]),
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let label = v["rows"][0]["searched"]["label"].as_str().unwrap();
    assert!(label.starts_with("list "), "{label}");
    assert!(
        v["rows"][0]["searched"]["fixed_step_s"].as_f64().unwrap()
            > v["rows"][0]["step_time_s"].as_f64().unwrap()
    );
    assert!(v["launch"]
        .as_str()
        .unwrap()
        .contains("--timetable best.json"));
    let tt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("best.json")).unwrap()).unwrap();
    assert_eq!(tt["devices"].as_array().unwrap().len(), 4);
}

#[test]
fn without_timetable_out_the_plan_says_what_to_add_and_search_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = cluster(d);
    let out = ok(d, &plan_args(&c, &[]));
    assert!(
        out.contains("--timetable TIMETABLE.csv")
            && out.contains("add --timetable-out TIMETABLE.csv to this plan"),
        "{out}"
    );
    let off = ok(d, &plan_args(&c, &["--max-searched", "0"]));
    assert!(
        !off.contains("searched (") && off.contains("--schedule "),
        "{off}"
    );
    assert!(off.contains(" 0 schedule searches"), "{off}");
    // A bad output name is refused before any work.
    let o = common::run_in(Some(d), &plan_args(&c, &["--timetable-out", "best.txt"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--timetable-out best.txt"),
        "{err}"
    );
}
