//! `pipewright search` and measured cost files end to end: from a run's measured costs to a
//! searched timetable that trains.

use std::path::Path;

use crate::common;

fn ok(dir: &Path, args: &[&str]) -> String {
    common::ok_in(Some(dir), args)
}

fn fails_with(dir: &Path, args: &[&str], needle: &str) {
    common::refused_in(Some(dir), args, Some(1), &[needle]);
}

#[test]
fn measured_costs_feed_a_search_whose_timetable_trains() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Synthetic stages of 2 ms F, 2 ms I, 2 ms W: the measured file must say at least that.
    ok(
        d,
        &[
            "bench",
            "--schedule",
            "zb-h1",
            "-p",
            "2",
            "-m",
            "4",
            "--cost",
            "2,4,2",
            "--steps",
            "3",
            "--costs-out",
            "costs.json",
        ],
    );
    let costs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("costs.json")).unwrap()).unwrap();
    let stages = costs["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    for s in stages {
        for k in ["f", "i", "w"] {
            let t = s[k].as_f64().unwrap();
            assert!(t >= 1.99, "{k} = {t} ms, but the stage sleeps 2 ms");
        }
    }
    assert_eq!(costs["time_unit"], "ms");
    // Two devices hand off: the file holds the measured latency, which `search` then uses.
    let latency = costs["p2p_latency"].as_f64();
    assert!(latency.is_some_and(|t| t >= 0.0), "{costs}");
    let table = ok(
        d,
        &[
            "search",
            "-p",
            "2",
            "-m",
            "4",
            "--memory-cap",
            "2",
            "--cost-file",
            "costs.json",
            "-o",
            "front.svg",
            "--timetable-out",
            "best.csv",
            "--chart",
            "best.png",
        ],
    );
    assert!(
        table.contains("best: ") && table.contains("Pareto front"),
        "{table}"
    );
    let svg = std::fs::read_to_string(d.join("front.svg")).unwrap();
    assert!(svg.contains("cap 2") && svg.contains("best: "));
    assert!(std::fs::read(d.join("best.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
    ok(d, &["validate", "best.csv"]);
    // The winner depends on the measured costs, so it may use any v up to the search's
    // default --max-virtual of 4: 2 devices x 4 chunks need 8 layers.
    let train = ok(
        d,
        &[
            "train",
            "--timetable",
            "best.csv",
            "--steps",
            "2",
            "--layers",
            "8",
        ],
    );
    assert!(train.contains("2 steps, loss"), "{train}");
}

#[test]
fn search_json_reports_a_best_that_fits_and_is_never_slower_than_the_fixed_families() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(
        dir.path(),
        &[
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
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let best = &v["best"];
    assert!(best["fits"].as_bool().unwrap());
    assert!(best["peak_microbatches"].as_f64().unwrap() <= 4.0);
    // Ranked by the steady-state period by default.
    assert_eq!(v["objective"], "period");
    let fixed = v["best_fixed"]["period"].as_f64().unwrap();
    assert!(best["period"].as_f64().unwrap() <= fixed);
    assert!(
        best["bubble"]["steady_state"].as_f64().unwrap()
            <= best["bubble"]["single_step"].as_f64().unwrap() + 1e-12
    );
    // 1F1B fits a cap of p; its period, its makespan (m + p - 1) * 3 = 33, bounds the answer.
    assert!(fixed <= 33.0);
}

#[test]
fn search_rejects_bad_caps_and_outputs_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(
        d,
        &["search", "--memory-cap", "0.5"],
        "no schedule fits a cap of 0.5 microbatches per device",
    );
    fails_with(
        d,
        &["search", "--memory-cap", "lots"],
        "memory cap `lots`: expected a number of microbatches",
    );
    fails_with(
        d,
        &["search", "--memory-cap", "1GiB"],
        "a memory cap in bytes needs activation sizes",
    );
    fails_with(
        d,
        &["search", "--memory-cap", "4", "-o", "front.txt"],
        "front.txt",
    );
    fails_with(
        d,
        &["search", "--memory-cap", "4", "--timetable-out", "x.txt"],
        "use a .csv or .json file name",
    );
    fails_with(
        d,
        &["search", "--memory-cap", "4", "--schedules", "1f1b,nope"],
        "unknown schedule `nope`",
    );
    assert!(
        std::fs::read_dir(d).unwrap().next().is_none(),
        "nothing written on failure"
    );
}

#[test]
fn a_cap_only_recomputation_meets_gives_a_timetable_with_rs_that_trains_to_the_same_losses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 1F1B's device 0 holds 2 microbatches; a stage's input is a quarter of its stash.
    let out = ok(
        d,
        &[
            "search",
            "-p",
            "2",
            "-m",
            "4",
            "--cost",
            "1,2",
            "--activation-bytes",
            "4000",
            "--p2p-bytes",
            "1000",
            "--memory-cap",
            "1.5",
            "--schedules",
            "1f1b",
            "--no-list",
            "--timetable-out",
            "best.json",
        ],
    );
    assert!(out.contains("best: 1f1b + recompute "), "{out}");
    // PyTorch's CSV has no recompute action, so the timetable goes to pipewright's JSON.
    let json = std::fs::read_to_string(d.join("best.json")).unwrap();
    assert!(json.contains("\"kind\": \"R\""), "{json}");
    let train = |extra: &[&str]| {
        let mut args = vec!["train", "--steps", "2", "--format", "json"];
        args.extend_from_slice(extra);
        let out = ok(d, &args);
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].clone())
            .collect::<Vec<_>>()
    };
    let plain = train(&["--schedule", "1f1b", "--stages", "2", "--microbatches", "4"]);
    assert_eq!(train(&["--timetable", "best.json"]), plain);
}

#[test]
fn runners_up_are_written_beside_the_best_and_told_apart_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = [
        "search",
        "-p",
        "2",
        "-m",
        "8",
        "--cost",
        "1,2",
        "--memory-cap",
        "4",
        "--timetable-out",
        "best.csv",
        "--runners-up",
        "2",
    ];
    ok(d, &args);
    let best = std::fs::read_to_string(d.join("best.csv")).unwrap();
    for k in [2, 3] {
        let next = std::fs::read_to_string(d.join(format!("best.{k}.csv"))).unwrap();
        assert_ne!(next, best, "best.{k}.csv is the best again");
        ok(d, &["validate", &format!("best.{k}.csv")]);
    }
    assert!(!d.join("best.4.csv").exists());
    // Fewer fitting timetables than asked for: said for each file not written.
    let out = common::run_in(
        Some(d),
        &[
            "search",
            "-p",
            "2",
            "-m",
            "2",
            "--schedules",
            "1f1b,gpipe",
            "--no-list",
            "--memory-cap",
            "4",
            "--timetable-out",
            "few.csv",
            "--runners-up",
            "4",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("few.5.csv not written"),
        "{err}"
    );
    fails_with(
        d,
        &[
            "search",
            "-p",
            "2",
            "-m",
            "8",
            "--memory-cap",
            "4",
            "--timetable-out",
            "b.csv",
            "--runners-up",
            "5",
        ],
        "--runners-up 5: give at most 4",
    );
    // A runner-up's name may not be an input: best.2.csv here is read as the cost file.
    std::fs::write(d.join("c.2.json"), r#"{"default": {"f": 1, "b": 2}}"#).unwrap();
    fails_with(
        d,
        &[
            "search",
            "-p",
            "2",
            "-m",
            "8",
            "--memory-cap",
            "4",
            "--cost-file",
            "c.2.json",
            "--timetable-out",
            "c.json",
            "--runners-up",
            "1",
        ],
        "would destroy the input",
    );
    // With --no-split-backward, no runner-up splits either.
    ok(
        d,
        &[
            "search",
            "-p",
            "2",
            "-m",
            "8",
            "--cost",
            "1,2",
            "--memory-cap",
            "4",
            "--timetable-out",
            "f.csv",
            "--runners-up",
            "3",
            "--no-split-backward",
        ],
    );
    for name in ["f.csv", "f.2.csv", "f.3.csv", "f.4.csv"] {
        let text = std::fs::read_to_string(d.join(name)).unwrap();
        assert!(!text.contains('I') && !text.contains('W'), "{name}: {text}");
    }
}
