//! `--recompute` on the command line: `schedule` writes the R actions, `simulate` charges
//! them, `train` runs them with the same losses and smaller stashes, bad values are one line.

use crate::common;

use common::ok;

fn refused(args: &[&str], code: i32, needle: &str) {
    common::refused_in(None, args, Some(code), &[needle]);
}

#[test]
fn bad_policies_are_refused_in_one_line() {
    refused(
        &["simulate", "--recompute", "most"],
        2,
        "unknown recompute policy 'most'",
    );
    refused(&["schedule", "--recompute", "x:full"], 2, "'x:full'");
    refused(
        &["simulate", "-p", "2", "--recompute", "5:full"],
        1,
        "--recompute: recompute names stage 5, but the timetable has 2 stages",
    );
}

#[test]
fn schedule_writes_r_before_each_backward_of_the_named_stages() {
    let args = ["schedule", "-p", "2", "-m", "2", "--recompute", "1:full"];
    let grid = ok(&args);
    let row = |d: u32| -> String {
        let line = grid.lines().find(|l| l.starts_with(&format!("dev {d}")));
        let cells = line.and_then(|l| l.split('|').nth(1)).unwrap_or_default();
        cells.split_whitespace().collect::<Vec<_>>().join(",")
    };
    assert_eq!(row(1), "1F0,1R0,1B0,1F1,1R1,1B1", "{grid}");
    assert!(!row(0).contains('R'), "{grid}");
    // PyTorch's CSV has no recompute action: refused in one line naming them.
    let mut csv = args.to_vec();
    csv.extend(["--format", "csv"]);
    refused(&csv, 1, "2 recompute actions (1R0, 1R1) on stage 1");
}

fn sim(policy: &str) -> serde_json::Value {
    let args = [
        "simulate",
        "-p",
        "4",
        "-m",
        "8",
        "--activation-bytes",
        "1000",
        "--p2p-bytes",
        "10",
        "--recompute",
        policy,
        "--format",
        "json",
    ];
    serde_json::from_str(&ok(&args)).unwrap()
}

#[test]
fn simulate_charges_each_r_a_forward_and_stashes_only_inputs_until_then() {
    let (none, full) = (sim("none"), sim("full"));
    // 1F1B, uniform F=1, B=2: (m+p-1)(f+b) without, plus m*f with.
    assert_eq!(none["makespan"], 33.0);
    assert_eq!(full["makespan"], 41.0);
    let peak = |v: &serde_json::Value, d: usize| v["devices"][d]["peak_activation_bytes"].clone();
    assert_eq!((peak(&none, 0), peak(&full, 0)), (4000.into(), 1000.into()));
    assert_eq!((peak(&none, 1), peak(&full, 1)), (3000.into(), 1020.into()));
}

fn train(policy: &str) -> Vec<serde_json::Value> {
    let args = [
        "train",
        "-p",
        "2",
        "-m",
        "4",
        "--steps",
        "2",
        "--schedule",
        "zb-h1",
        "--recompute",
        policy,
        "--format",
        "json",
    ];
    ok(&args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn train_recomputes_with_the_same_losses_and_smaller_stashes() {
    let none = train("none");
    for policy in ["full", "selective", "0:full"] {
        let got = train(policy);
        for (a, b) in got.iter().zip(&none) {
            assert_eq!(a["loss"], b["loss"], "{policy}");
            let (ka, kb) = (&a["kept_per_microbatch"][0], &b["kept_per_microbatch"][0]);
            assert!(
                ka.as_u64().unwrap() < kb.as_u64().unwrap(),
                "{policy}: {ka} {kb}"
            );
        }
    }
}

/// `train` reports each rank's measured memory: JSON by global rank and category, where full
/// recomputation lowers the first 1F1B device's activations and nothing else's parameters;
/// the table prints one line of each device's peak, and `--chart` draws the bars.
#[test]
fn train_reports_measured_memory_per_rank_and_device() {
    let json = |policy: &str| -> Vec<serde_json::Value> {
        let args = [
            "train",
            "-p",
            "4",
            "-m",
            "8",
            "--layers",
            "4",
            "--steps",
            "2",
            "--recompute",
            policy,
            "--format",
            "json",
        ];
        ok(&args)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (none, full) = (json("none"), json("full"));
    let field = |rows: &[serde_json::Value], rank: usize, cat: &str| {
        rows[1]["memory"][rank]["max"][cat].as_u64().unwrap()
    };
    assert_eq!(none[1]["memory"].as_array().unwrap().len(), 4);
    for rank in 0..4 {
        assert_eq!(
            field(&none, rank, "activations"),
            none[1]["peak_stash_bytes"][rank].as_u64().unwrap()
        );
        assert!(field(&none, rank, "parameters") > 0);
        assert_eq!(
            field(&none, rank, "parameters"),
            field(&full, rank, "parameters")
        );
    }
    assert!(field(&none, 0, "activations") > field(&none, 3, "activations"));
    assert!(field(&full, 0, "activations") < field(&none, 0, "activations"));

    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("train.svg");
    let table = ok(&[
        "train",
        "-p",
        "2",
        "-m",
        "4",
        "--steps",
        "2",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let line = table
        .lines()
        .find(|l| l.starts_with("measured peak memory: "))
        .unwrap_or_else(|| panic!("no memory line in {table}"));
    assert!(line.contains("dev 0 ") && line.contains("dev 1 "), "{line}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("optimizer state") && svg.contains("measured peak memory per device"));
}
