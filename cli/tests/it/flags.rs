//! Flags and words (issue 25): a flag is honoured or refused, never dropped (class 7); sums
//! are checked, not only values (class 8); errors say what is wrong in the reader's terms
//! (class 9); machine output is in proportion to the request (class 10).

use std::path::Path;

use crate::common;

fn refused(dir: &Path, args: &[&str], needles: &[&str]) {
    common::refused_in(Some(dir), args, Some(1), needles);
}

fn ok(dir: &Path, args: &[&str]) -> String {
    common::ok_in(Some(dir), args)
}

const SMALL: [&str; 10] = [
    "--layers",
    "4",
    "--d-model",
    "64",
    "--heads",
    "4",
    "--seq-len",
    "16",
    "--gpus",
    "4",
];

fn plan(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["plan"]
        .iter()
        .chain(SMALL.iter())
        .map(|s| s.to_string())
        .collect();
    args.extend(["--global-batch", "8"].iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn class7_a_flag_is_honoured_or_refused_never_dropped() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    // A fixed schedule is what every row runs, or the request is refused.
    for (schedule, v) in [
        ("zbv", None),
        ("gpipe", None),
        ("interleaved-1f1b", Some("2")),
    ] {
        let mut extra = vec!["--schedule", schedule, "--format", "json", "--top", "50"];
        if let Some(v) = v {
            extra.extend(["--v", v]);
        }
        let args = plan(&extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let json: serde_json::Value = serde_json::from_str(&ok(d, &args)).unwrap();
        let rows = json["rows"].as_array().unwrap();
        assert!(!rows.is_empty());
        for r in rows {
            assert_eq!(r["config"]["schedule"], schedule, "{r}");
            assert!(r["config"]["pp"].as_u64().unwrap() > 1, "{r}");
            if let Some(v) = v {
                assert_eq!(r["config"]["v"].to_string(), v, "{r}");
            }
        }
    }
    for (extra, needles) in [
        (
            &["--schedule", "zbv", "--v", "1"][..],
            &["--v 1", "zbv", "exactly 2"][..],
        ),
        (&["--schedule", "1f1b", "--v", "2"], &["--v 2", "one stage"]),
        (
            &["--schedule", "zbv", "--pp", "1"],
            &["--schedule zbv with --pp 1"],
        ),
        (&["--max-simulated", "0"], &["--max-simulated 0"]),
    ] {
        let args = plan(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(d, &args, needles);
    }
    // Counts of 0 are refused where other commands refuse them.
    refused(
        d,
        &["search", "--memory-cap", "4", "--max-virtual", "0"],
        &["--max-virtual 0"],
    );
    refused(d, &["bench", "--steps", "0"], &["--steps 0"]);
    refused(d, &["viz", "--columns", "0"], &["--columns 0"]);
    refused(
        d,
        &["sweep", "-m", "0,4"],
        &["--microbatches", "at least 1"],
    );
    refused(d, &["sweep", "-v", "0"], &["--virtual", "at least 1"]);
    // Beside a timeline, times and recomputation are given already.
    ok(
        d,
        &["simulate", "-p", "2", "-m", "4", "--timeline", "tl.json"],
    );
    refused(
        d,
        &["viz", "--from", "tl.json", "--cost", "1,5"],
        &["--cost does not apply", "tl.json"],
    );
    refused(
        d,
        &["viz", "--from", "tl.json", "--recompute", "full"],
        &["--recompute does not apply"],
    );
    refused(
        d,
        &["viz", "--from", "tl.json", "--activation-bytes", "1MiB"],
        &["add --memory"],
    );
    refused(d, &["viz", "--memory"], &["--memory", "-o FILE"]);
}

#[test]
fn class8_sums_are_checked_not_only_each_value() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let huge = ["--cost", "1e307,1e307"];
    for cmd in [
        &["simulate"][..],
        &["search", "--memory-cap", "8"],
        &["bench"],
    ] {
        let args: Vec<&str> = cmd.iter().chain(huge.iter()).copied().collect();
        refused(d, &args, &["add up", "the simulator can time"]);
    }
    let sweep = ok(d, &["sweep", "--cost", "1e307,1e307", "-m", "4"]);
    assert!(
        sweep.contains("add up") && !sweep.contains("inf"),
        "{sweep}"
    );
    refused(
        d,
        &[
            "simulate",
            "--activation-bytes",
            "18446744073709551615",
            "-m",
            "8",
        ],
        &["add up", "2^64"],
    );
    refused(
        d,
        &[
            "simulate",
            "--layers",
            "4",
            "--d-model",
            "4000000000",
            "--heads",
            "1",
            "--seq-len",
            "100000000",
            "--vocab",
            "2",
        ],
        &["pass 2^60"],
    );
}

#[test]
fn class9_errors_say_what_is_wrong_in_the_readers_terms() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    // A 20 MB token is not echoed whole.
    std::fs::write(d.join("long.csv"), "7".repeat(20_000_000)).unwrap();
    let line = common::refused_in(
        Some(d),
        &["validate", "long.csv"],
        Some(1),
        &["long.csv", "characters"],
    );
    assert!(line.len() < 1000, "{} bytes", line.len());
    let plan_refused = |extra: &[&str], needles: &[&str]| {
        let mut args = vec![
            "plan",
            "--layers",
            "4",
            "--d-model",
            "64",
            "--heads",
            "4",
            "--seq-len",
            "16",
        ];
        args.extend_from_slice(extra);
        refused(d, &args, needles);
    };
    plan_refused(
        &[
            "--global-batch",
            "7",
            "--gpus",
            "8",
            "--tp",
            "1",
            "--pp",
            "1",
        ],
        &["global batch 7", "dp = 8"],
    );
    plan_refused(
        &["--global-batch", "8", "--gpus", "1000000000"],
        &["global batch 8", "too small", "dp = 62500000"],
    );
    common::refused_in(
        Some(d),
        &["train", "--recompute", "every:0", "--steps", "1"],
        Some(2),
        &["every:0", "at least 1"],
    );
    // A .json file is read as JSON and its error says so.
    std::fs::write(d.join("c.json"), "0F0,0B0\n").unwrap();
    let line = common::refused_in(Some(d), &["validate", "c.json"], Some(1), &["c.json"]);
    assert!(
        !line.contains("column 4") && !line.contains("stage number"),
        "{line}"
    );
    // One byte parser everywhere.
    let out = ok(
        d,
        &["simulate", "--activation-bytes", "1MiB", "--format", "json"],
    );
    assert!(out.contains("\"peak_activation_bytes\": 4194304"), "{out}");
    common::refused_in(
        Some(d),
        &["simulate", "--p2p-bytes", "1.5"],
        Some(2),
        &["not a byte count"],
    );
    // validate --format json says so on failure too.
    std::fs::write(d.join("bad.csv"), "0F0\n").unwrap();
    let o = common::run_in(Some(d), &["validate", "bad.csv", "--format", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(v["error"].as_str().unwrap().contains("bad.csv"), "{v}");
}

#[test]
fn class10_simulate_json_is_a_summary_unless_the_series_is_asked_for() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let args = [
        "simulate",
        "-p",
        "8",
        "-v",
        "2",
        "--schedule",
        "interleaved-1f1b",
        "-m",
        "32",
        "--format",
        "json",
    ];
    let summary = ok(d, &args);
    let v: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert!(v["devices"][0].get("memory").is_none(), "{summary}");
    assert!(v["devices"][0]["peak_activations"].as_u64().is_some());
    let mut with = args.to_vec();
    with.push("--memory-series");
    let full = ok(d, &with);
    let f: serde_json::Value = serde_json::from_str(&full).unwrap();
    assert!(f["devices"][0]["memory"]
        .as_array()
        .is_some_and(|m| !m.is_empty()));
    assert!(
        full.len() > 10 * summary.len(),
        "{} vs {}",
        full.len(),
        summary.len()
    );
    refused(
        d,
        &["simulate", "--memory-series"],
        &["--memory-series", "--format json"],
    );
}
