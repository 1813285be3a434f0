//! Size and time bounded by what this machine has (issue 25, class 3), and timelines checked
//! as strictly as timetables before they are drawn (class 6): each refusal is one line with
//! the figure, made in well under a second, before anything large is allocated.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;

fn refused_fast(dir: &Path, args: &[&str], needles: &[&str]) {
    let started = Instant::now();
    common::refused_in(Some(dir), args, Some(1), needles);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{args:?} took {:?}",
        started.elapsed()
    );
}

#[test]
fn class3_requests_beyond_this_machine_are_refused_with_the_figure() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    // Tiny files naming huge numbers: refused by what they hold, not tables by the number.
    std::fs::write(d.join("big.csv"), "0F0,0B268435455\n").unwrap();
    refused_fast(d, &["validate", "big.csv"], &["big.csv", "0F1 is missing"]);
    std::fs::write(
        d.join("big.json"),
        r#"{"microbatches":200000000,"stage_device":[0],"devices":[[{"stage":0,"kind":"F","microbatch":0}]]}"#,
    )
    .unwrap();
    refused_fast(d, &["validate", "big.json"], &["big.json", "missing"]);
    // Things that are not files, or are larger than any file pipewright writes.
    refused_fast(d, &["validate", "/dev/zero"], &["/dev/zero is a device"]);
    refused_fast(d, &["simulate", "--cost-file", "."], &["is a folder"]);
    let huge = std::fs::File::create(d.join("huge.csv")).unwrap();
    huge.set_len((1 << 30) + 1).unwrap(); // sparse: no disk used
    refused_fast(
        d,
        &["validate", "huge.csv"],
        &["huge.csv is 1.00 GiB", "more than"],
    );
    // Requests whose estimate is beyond this machine's memory.
    let beyond = ["needs about", "more than this machine's"];
    for args in [
        &["simulate", "-p", "16000", "-m", "16000"][..],
        &["schedule", "-p", "16000", "-m", "16000"],
        &["viz", "-p", "128", "-m", "128", "--steps", "1000"],
        &[
            "search",
            "-p",
            "8192",
            "-m",
            "8192",
            "--memory-cap",
            "8",
            "--time-budget",
            "2",
        ],
        &["train", "--d-model", "100000", "--steps", "1"],
        &["train", "--vocab", "100000000", "--steps", "1"],
        &["train", "--seq-len", "10000000", "--steps", "1"],
        &["train", "--layers", "100000000", "--steps", "1"],
        &["train", "--microbatch-size", "100000000", "--steps", "1"],
        &["bench", "-p", "4096", "-m", "65536"],
    ] {
        refused_fast(d, args, &beyond);
    }
    refused_fast(
        d,
        &["sweep", "-m", "1..100000"],
        &["the sweep simulates", "narrow --microbatches"],
    );
    // plan --validate trains in-process: only what fits here, or one line saying so.
    common::plan::refused(
        &[
            "--layers",
            "8",
            "--d-model",
            "4096",
            "--heads",
            "32",
            "--seq-len",
            "1024",
            "--gpus",
            "4",
            "--global-batch",
            "8",
            "--validate",
            "2",
        ],
        &["--validate", "fit this machine", "the smallest needs"],
    );
}

#[test]
fn class3_the_search_time_budget_bounds_every_phase() {
    // Nothing fits the cap but the list scheduler: the fixed families over it used to be
    // simulated first, past any budget.
    let started = Instant::now();
    let out = common::ok(&[
        "search",
        "-p",
        "128",
        "-m",
        "512",
        "--memory-cap",
        "8",
        "--time-budget",
        "3",
    ]);
    let spent = started.elapsed();
    assert!(out.contains("cut short by the time budget"), "{out}");
    assert!(out.contains("best: list"), "{out}");
    assert!(
        spent < Duration::from_secs(25),
        "{spent:?} for a 3 s budget"
    );
}

/// A simulated timeline of 1F1B on 2 devices, 3 microbatches, edited by `f`.
fn timeline(dir: &Path, name: &str, f: impl FnOnce(&mut serde_json::Value)) {
    common::ok_in(
        Some(dir),
        &["simulate", "-p", "2", "-m", "3", "--timeline", "base.json"],
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("base.json")).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(dir.join(name), v.to_string()).unwrap();
}

/// The index of the first event of `kind` on `device`.
fn first(v: &serde_json::Value, kind: &str, device: u64) -> usize {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| e["action"]["kind"] == kind && e["device"] == device)
        .unwrap()
}

/// An edit of a timeline's JSON.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

#[test]
fn class6_a_timeline_that_contradicts_itself_is_not_drawn() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "backwards.json",
            Box::new(|v| {
                let i = first(v, "B", 0);
                v["events"][i]["end"] = serde_json::json!(-1.0);
            }),
            "before it starts",
        ),
        (
            "overlap.json",
            Box::new(|v| {
                let i = first(v, "B", 1);
                let s = v["events"][i]["start"].as_f64().unwrap();
                v["events"][i]["start"] = serde_json::json!(s - 0.5);
            }),
            "one device computes one thing at a time",
        ),
        (
            "twice.json",
            Box::new(|v| {
                let i = first(v, "F", 0);
                let mut again = v["events"][i].clone();
                again["start"] = serde_json::json!(100.0);
                again["end"] = serde_json::json!(101.0);
                v["events"].as_array_mut().unwrap().push(again);
            }),
            "duplicated",
        ),
        (
            "stage.json",
            Box::new(|v| v["events"][0]["action"]["stage"] = serde_json::json!(5)),
            "stage 5 does not exist",
        ),
        (
            "mb.json",
            Box::new(|v| v["events"][0]["action"]["microbatch"] = serde_json::json!(9)),
            "microbatch 9 does not exist",
        ),
        (
            "empty.json",
            Box::new(|v| v["events"] = serde_json::json!([])),
            "no events",
        ),
        (
            "missing.json",
            Box::new(|v| {
                let i = first(v, "B", 1);
                v["events"].as_array_mut().unwrap().remove(i);
            }),
            "no backward",
        ),
    ];
    for (name, edit, why) in cases {
        timeline(d, name, edit);
        refused_fast(d, &["viz", "--from", name], &[name, why]);
    }
    // What simulate, train and bench write is drawn.
    common::ok_in(Some(d), &["viz", "--from", "base.json"]);
    common::ok_in(
        Some(d),
        &[
            "simulate",
            "--schedule",
            "dualpipev",
            "-v",
            "2",
            "-m",
            "8",
            "--steps",
            "3",
            "--timeline",
            "s.json",
        ],
    );
    common::ok_in(Some(d), &["viz", "--from", "s.json"]);
    common::ok_in(
        Some(d),
        &[
            "train",
            "--steps",
            "2",
            "--schedule",
            "zbv",
            "-v",
            "2",
            "--layers",
            "8",
            "--trace",
            "t.json",
        ],
    );
    common::ok_in(Some(d), &["viz", "--from", "t.json"]);
}
