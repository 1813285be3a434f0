//! PyTorch's CSV forms from the command line: every command that writes a timetable writes
//! PyTorch's compute-only form for `.csv`, its compute+comms form with `--comms`, refuses
//! what PyTorch cannot run in one line, and `train --timetable` runs both forms.

use crate::common;

use common::{ok_in, refused_in};

fn read(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[test]
fn schedule_writes_compute_only_by_default_and_compute_comms_on_request() {
    let t = tempfile::tempdir().unwrap();
    let d = Some(t.path());
    ok_in(
        d,
        &[
            "schedule",
            "--schedule",
            "1f1b",
            "-p",
            "2",
            "-m",
            "2",
            "-o",
            "a.csv",
        ],
    );
    assert_eq!(
        read(t.path(), "a.csv"),
        "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    );
    let args = [
        "schedule",
        "--schedule",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "-o",
        "b.csv",
        "--comms",
    ];
    ok_in(d, &args);
    let b = read(t.path(), "b.csv");
    assert!(
        b.starts_with("0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,"),
        "{b}"
    );
    // --lower with --comms is the same file: PyTorch's sends are placed afresh.
    ok_in(
        d,
        &[
            "schedule",
            "--schedule",
            "1f1b",
            "-p",
            "2",
            "-m",
            "2",
            "-o",
            "c.csv",
            "--comms",
            "--lower",
        ],
    );
    assert_eq!(read(t.path(), "c.csv"), b);
    // Standard output takes the same flag.
    let out = ok_in(
        d,
        &[
            "schedule", "-p", "2", "-m", "2", "--format", "csv", "--comms",
        ],
    );
    assert_eq!(out, b);
}

#[test]
fn what_pytorch_cannot_read_is_refused_before_anything_is_written() {
    let t = tempfile::tempdir().unwrap();
    let d = Some(t.path());
    refused_in(
        d,
        &["schedule", "--recompute", "full", "-o", "r.csv"],
        Some(1),
        &[
            "recompute actions",
            "activation checkpointing",
            ".json timetable",
        ],
    );
    refused_in(
        d,
        &["schedule", "--lower", "-o", "l.csv"],
        Some(1),
        &["--lower", "--comms", ".json"],
    );
    refused_in(
        d,
        &["schedule", "--comms", "-o", "c.json"],
        Some(1),
        &["--comms applies to CSV"],
    );
    refused_in(
        d,
        &["schedule", "--comms"],
        Some(1),
        &["--comms applies to CSV"],
    );
    refused_in(
        d,
        &[
            "search",
            "--memory-cap",
            "4",
            "--comms",
            "--time-budget",
            "1",
        ],
        Some(1),
        &["--comms applies to a timetable written as CSV"],
    );
    refused_in(
        d,
        &[
            "search",
            "--memory-cap",
            "4",
            "--comms",
            "--timetable-out",
            "s.json",
        ],
        Some(1),
        &["--timetable-out s.json is not one"],
    );
    assert!(
        std::fs::read_dir(t.path()).unwrap().next().is_none(),
        "a refused run wrote a file"
    );
    // pipewright's own JSON keeps the recomputation.
    ok_in(d, &["schedule", "--recompute", "full", "-o", "r.json"]);
}

#[test]
fn search_writes_pytorchs_forms_and_both_read_back() {
    let t = tempfile::tempdir().unwrap();
    let d = Some(t.path());
    let search = |out: &str, comms: bool| {
        let mut args = vec![
            "search",
            "-p",
            "2",
            "-m",
            "4",
            "--memory-cap",
            "3",
            "--time-budget",
            "5",
            "--timetable-out",
            out,
        ];
        if comms {
            args.push("--comms");
        }
        ok_in(d, &args);
    };
    search("best.csv", false);
    search("comms.csv", true);
    let best = read(t.path(), "best.csv");
    assert!(!best.contains("SEND") && !best.contains("RECV"), "{best}");
    assert!(read(t.path(), "comms.csv").contains("WAIT_SEND_F"));
    for f in ["best.csv", "comms.csv"] {
        let v = ok_in(d, &["validate", f, "--format", "json"]);
        assert!(v.contains("\"valid\":true"), "{f}: {v}");
    }
}

#[test]
fn train_runs_both_forms() {
    let t = tempfile::tempdir().unwrap();
    let d = Some(t.path());
    for (name, comms) in [("plain.csv", false), ("comms.csv", true)] {
        let mut args = vec![
            "schedule",
            "--schedule",
            "zb-h1",
            "-p",
            "2",
            "-m",
            "4",
            "-o",
            name,
        ];
        if comms {
            args.push("--comms");
        }
        ok_in(d, &args);
    }
    let mut losses = Vec::new();
    for name in ["plain.csv", "comms.csv"] {
        let out = ok_in(
            d,
            &[
                "train",
                "--timetable",
                name,
                "--steps",
                "2",
                "--format",
                "json",
            ],
        );
        let step_losses: Vec<f64> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(step_losses.len(), 2, "{out}");
        losses.push(step_losses);
    }
    // Same compute order, same model, same seed: the same losses.
    assert_eq!(losses[0], losses[1]);
}

#[test]
fn a_searched_timetable_with_recomputation_is_refused_as_csv_before_any_output() {
    let t = tempfile::tempdir().unwrap();
    let d = Some(t.path());
    let mut args = vec![
        "search",
        "-p",
        "2",
        "-m",
        "4",
        "--activation-bytes",
        "4000",
        "--p2p-bytes",
        "1000",
        "--memory-cap",
        "1.5",
        "--schedules",
        "1f1b",
        "--no-list",
        "--chart",
        "c.svg",
        "--timetable-out",
    ];
    args.push("best.csv");
    refused_in(
        d,
        &args,
        Some(1),
        &["recompute actions (0R0", "activation checkpointing"],
    );
    assert!(
        std::fs::read_dir(t.path()).unwrap().next().is_none(),
        "a refused search wrote a file"
    );
    // As pipewright's JSON it is written, with its recomputation.
    *args.last_mut().unwrap() = "best.json";
    ok_in(d, &args);
    assert!(read(t.path(), "best.json").contains("\"R\""));
}
