//! Bad or careless input, by class of failure: each case exits non-zero with one line on
//! stderr naming the problem, never panics, and never does the work first.

use std::path::Path;
use std::process::Output;

use crate::common;

fn run_in(dir: &Path, args: &[&str]) -> Output {
    common::run_in(Some(dir), args)
}

/// Exits with `code`, one stderr line that starts with `error: ` and holds every needle.
fn refused(dir: &Path, args: &[&str], code: i32, needles: &[&str]) {
    common::refused_in(Some(dir), args, Some(code), needles);
}

fn ok(dir: &Path, args: &[&str]) -> String {
    common::ok_in(Some(dir), args)
}

/// A folder holding `good.csv`: 1F1B on 2 devices, 4 microbatches.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ok(
        dir.path(),
        &["schedule", "-p", "2", "-m", "4", "-o", "good.csv"],
    );
    dir
}

#[test]
fn class1_flags_that_contradict_a_timetable_file_are_refused_naming_both() {
    let d = setup();
    let d = d.path();
    refused(
        d,
        &["simulate", "--timetable", "good.csv", "--stages", "4"],
        1,
        &["--stages 4", "good.csv", "2 devices"],
    );
    refused(
        d,
        &[
            "train",
            "--timetable",
            "good.csv",
            "-m",
            "8",
            "--steps",
            "1",
        ],
        1,
        &["--microbatches 8", "4 microbatches"],
    );
    refused(
        d,
        &["simulate", "--timetable", "good.csv", "--virtual", "2"],
        1,
        &["--virtual 2", "2 stages on 2 devices"],
    );
    refused(
        d,
        &["bench", "--timetable", "good.csv", "--schedule", "gpipe"],
        1,
        &["--schedule gpipe", "custom"],
    );
    refused(
        d,
        &["simulate", "--timetable", "good.csv", "--group-size", "2"],
        1,
        &["--group-size does not apply"],
    );
    // Flags that agree with the file are harmless.
    let out = ok(
        d,
        &["simulate", "--timetable", "good.csv", "-p", "2", "-m", "4"],
    );
    assert!(out.contains("p=2 stages=2 m=4"), "{out}");
    // So are a timeline's.
    ok(
        d,
        &["simulate", "-p", "2", "-m", "4", "--timeline", "tl.json"],
    );
    refused(
        d,
        &["viz", "--from", "tl.json", "-p", "3"],
        1,
        &["--stages 3", "tl.json", "2 devices"],
    );
}

#[test]
fn csv_reader_blank_rows_bom_and_bad_cells() {
    let d = setup();
    let d = d.path();
    std::fs::write(d.join("blank.csv"), "0F0,0B0\n\n1F0,1B0\n").unwrap();
    refused(
        d,
        &["validate", "blank.csv"],
        1,
        &["blank.csv", "line 2 is blank"],
    );
    let good = std::fs::read_to_string(d.join("good.csv")).unwrap();
    std::fs::write(d.join("bom.csv"), format!("\u{feff}{good}\n\n")).unwrap();
    let out = ok(d, &["validate", "bom.csv"]);
    assert!(out.contains("valid: 2 devices"), "{out}");
    std::fs::write(d.join("bad.csv"), "0F0,0B0\n1F0,1Q0\n").unwrap();
    refused(
        d,
        &["validate", "bad.csv"],
        1,
        &["bad.csv", "line 2, column 5"],
    );
    std::fs::write(d.join("bin.csv"), [0xff, 0xfe, 0x00]).unwrap();
    refused(
        d,
        &["validate", "bin.csv"],
        1,
        &["bin.csv is not a text file"],
    );
}

#[test]
fn json_readers_name_the_kind_of_file_they_were_given() {
    let d = setup();
    let d = d.path();
    ok(d, &["schedule", "-p", "2", "-m", "4", "-o", "tt.json"]);
    ok(
        d,
        &["simulate", "-p", "2", "-m", "4", "--timeline", "tl.json"],
    );
    std::fs::write(d.join("cost.json"), r#"{"default": {"f": 1, "b": 2}}"#).unwrap();
    refused(
        d,
        &["simulate", "--timetable", "cost.json"],
        1,
        &["cost.json is a cost file", "not a timetable"],
    );
    refused(
        d,
        &["train", "--timetable", "tl.json", "--steps", "1"],
        1,
        &["tl.json is a timeline", "not a timetable"],
    );
    refused(
        d,
        &["simulate", "--cost-file", "tt.json"],
        1,
        &["tt.json is a timetable", "not a cost file"],
    );
    refused(
        d,
        &["viz", "--from", "cost.json"],
        1,
        &["cost.json is a cost file", "not a timeline"],
    );
    // Broken files of the right kind: the file and the problem named.
    std::fs::write(
        d.join("half.json"),
        r#"{"devices": [], "stage_device": []}"#,
    )
    .unwrap();
    refused(
        d,
        &["validate", "half.json"],
        1,
        &["half.json", "microbatches"],
    );
    std::fs::write(d.join("tl2.json"), r#"{"meta": 3, "events": []}"#).unwrap();
    refused(
        d,
        &["viz", "--from", "tl2.json"],
        1,
        &["tl2.json is not a timeline JSON"],
    );
    let tl = std::fs::read_to_string(d.join("tl.json")).unwrap();
    let huge = tl.replacen("\"devices\":2", "\"devices\":4000000000", 1);
    assert_ne!(huge, tl);
    std::fs::write(d.join("huge.json"), huge).unwrap();
    refused(
        d,
        &["viz", "--from", "huge.json"],
        1,
        &["huge.json", "4000000000 devices"],
    );
    std::fs::write(d.join("neg.json"), r#"{"default": {"f": -1, "b": 2}}"#).unwrap();
    refused(
        d,
        &["simulate", "--cost-file", "neg.json"],
        1,
        &["neg.json", "f must be a finite number >= 0 (got -1)"],
    );
}

#[test]
fn class2_hyperparameters_are_checked_before_any_step() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    for lr in ["nan", "-1", "1e30", "0", "inf"] {
        refused(
            d,
            &["train", "--lr", lr, "--steps", "1"],
            1,
            &["--lr", "above 0 and at most 1"],
        );
    }
    refused(d, &["train", "--lr=-1", "--steps", "1"], 1, &["--lr -1"]);
    refused(
        d,
        &["train", "--vocab", "1", "--steps", "1"],
        1,
        &["--vocab 1", "at least 2"],
    );
    refused(
        d,
        &["train", "--steps", "0"],
        1,
        &["--steps 0", "at least 1"],
    );
    refused(
        d,
        &["train", "--heads", "3", "--steps", "1"],
        1,
        &["--heads 3 must divide --d-model 64"],
    );
    for level in ["2", "3"] {
        refused(
            d,
            &[
                "train", "--stages", "2", "--dp", "2", "--zero", level, "--steps", "1",
            ],
            1,
            &[
                &format!("--zero {level}"),
                "pp = 2",
                "accumulates",
                "use ZeRO-1",
            ],
        );
    }
    refused(
        d,
        &["train", "--stages", "1", "--zero", "2", "--steps", "1"],
        1,
        &["--zero 2", "levels 0 and 1"],
    );
}

#[test]
fn class3_outputs_are_checked_before_the_work() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let started = std::time::Instant::now();
    // 500 steps would take many seconds: the refusal comes first.
    refused(
        d,
        &["train", "--steps", "500", "--chart", "nodir/c.png"],
        1,
        &["--chart nodir/c.png", "folder nodir does not exist"],
    );
    assert!(
        started.elapsed().as_secs() < 5,
        "refused only after the work"
    );
    refused(
        d,
        &[
            "train",
            "--steps",
            "500",
            "--trace",
            "same.json",
            "--costs-out",
            "same.json",
        ],
        1,
        &["--trace and --costs-out both name same.json"],
    );
    refused(
        d,
        &["simulate", "--trace", "t.png"],
        1,
        &["--trace t.png", "use a .json file name"],
    );
    refused(
        d,
        &[
            "search",
            "--memory-cap",
            "4",
            "-o",
            "f.svg",
            "--chart",
            "./f.svg",
        ],
        1,
        &["both name"],
    );
    refused(
        d,
        &["sweep", "-o", "plot.txt"],
        1,
        &["-o plot.txt", ".svg or .png"],
    );
    refused(
        d,
        &["schedule", "--format", "grid", "-o", "grid.csv"],
        1,
        &["-o grid.csv", "--format"],
    );
    refused(d, &["schedule", "-o", "plan"], 1, &["-o plan", ".csv"]);
    assert!(
        std::fs::read_dir(d).unwrap().next().is_none(),
        "a refused run wrote a file"
    );
    // What -o x.csv writes, --timetable x.csv reads back.
    ok(
        d,
        &["schedule", "--schedule", "zb-h1", "-o", "x.csv", "--comms"],
    );
    let out = ok(d, &["simulate", "--timetable", "x.csv", "--format", "json"]);
    assert!(out.contains("\"makespan\""), "{out}");
    // The grid is for people: no file of it is offered, since nothing reads it back.
    refused(
        d,
        &["schedule", "-o", "x.txt"],
        1,
        &["-o x.txt", "nothing reads it back"],
    );
    let grid = ok(d, &["schedule"]);
    assert!(grid.starts_with("1f1b p=4"), "{grid}");
}

fn peaks(json: &str) -> Vec<(u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["peak_activations"].as_u64().unwrap(),
                d["peak_activation_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn class4_zero_costs_peak_as_tiny_costs_and_undefined_figures_are_not_zero() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let base = [
        "simulate",
        "--schedule",
        "interleaved-1f1b",
        "-v",
        "2",
        "-p",
        "4",
        "-m",
        "8",
    ];
    let with = |cost: &str| {
        let mut args = base.to_vec();
        args.extend([
            "--cost",
            cost,
            "--activation-bytes",
            "100",
            "--format",
            "json",
        ]);
        ok(d, &args)
    };
    let zero = with("0,0");
    assert_eq!(peaks(&zero), peaks(&with("1e-9,2e-9")));
    assert!(peaks(&zero).iter().all(|&(n, _)| n > 0), "{zero}");
    assert!(zero.contains("\"bubble_fraction\": null"), "{zero}");
    let table = ok(d, &["simulate", "--cost", "0,0"]);
    assert!(table.contains("bubble undefined"), "{table}");
    let sweep = ok(d, &["sweep", "--cost", "0,0", "-m", "4", "--format", "csv"]);
    assert!(
        sweep
            .lines()
            .skip(1)
            .all(|l| l.contains("undefined") && !l.contains(",0,")),
        "{sweep}"
    );
    refused(d, &["viz", "--cost", "0,0"], 1, &["takes no time"]);
    refused(
        d,
        &["sweep", "--cost", "0,0", "-m", "4", "-o", "s.png"],
        1,
        &["nothing to plot"],
    );
}

#[test]
fn class6_cost_flags_say_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    refused(
        d,
        &["simulate", "--cost", "-1,2"],
        1,
        &["--cost", "f must be a finite number >= 0 (got -1)"],
    );
    refused(
        d,
        &["simulate", "--schedule", "zb-h1", "--cost", "1,2,5"],
        1,
        &["w = 5 is larger than b = 2"],
    );
    refused(d, &["simulate", "--cost", "1,x"], 1, &["--cost `1,x`"]);
    refused(
        d,
        &["search", "--memory-cap", "8", "--w-memory", "1.5"],
        1,
        &["--w-memory: w_memory = 1.5 is not a fraction in [0, 1]"],
    );
    std::fs::write(
        d.join("c.json"),
        r#"{"default": {"f": 1, "b": 2, "w_memory": -0.5}}"#,
    )
    .unwrap();
    refused(
        d,
        &["simulate", "--cost-file", "c.json"],
        1,
        &["stage 0: w_memory = -0.5 is not a fraction"],
    );
    refused(d, &["simulate", "--cost", "nan,1"], 1, &["--cost `nan,1`"]);
    refused(
        d,
        &["simulate", "--p2p-latency", "-1"],
        1,
        &["p2p latency", "got -1"],
    );
    // Clap's own refusals are one line too, with exit 2.
    refused(d, &["simulate", "--bogus"], 2, &["'--bogus'"]);
}

#[test]
fn memory_caps_share_one_parser_with_units_everywhere() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    for cmd in ["search", "sweep"] {
        refused(
            d,
            &[cmd, "--memory-cap", "0", "--activation-bytes", "10"],
            1,
            &["memory cap `0`", "positive cap"],
        );
        refused(
            d,
            &[cmd, "--memory-cap", "-2", "--activation-bytes", "10"],
            1,
            &["memory cap `-2`"],
        );
        refused(
            d,
            &[cmd, "--memory-cap", "lots", "--activation-bytes", "10"],
            1,
            &["memory cap `lots`", "512MiB"],
        );
    }
    let out = ok(
        d,
        &[
            "sweep",
            "--memory-cap",
            "24GiB",
            "--activation-bytes",
            "1000",
            "-m",
            "4",
        ],
    );
    assert!(out.contains("cap of 25769803776 bytes"), "{out}");
    // 2 microbatches of a device's share (1000 bytes each) = 2000 bytes.
    let out = ok(
        d,
        &[
            "sweep",
            "--memory-cap",
            "2",
            "--activation-bytes",
            "1000",
            "-m",
            "4",
        ],
    );
    assert!(out.contains("cap of 2000 bytes"), "{out}");
    refused(
        d,
        &["sweep", "--memory-cap", "4"],
        1,
        &["needs activation sizes"],
    );
}

/// `--sequence-parallel` cuts each sequence into `--tp` slices: a length they do not divide
/// is refused before the first step; with `--tp 1` it changes nothing, and a warning says so.
#[test]
fn sequence_parallel_needs_a_sequence_length_tp_divides() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    refused(
        d,
        &[
            "train",
            "--tp",
            "2",
            "--seq-len",
            "15",
            "--sequence-parallel",
            "--steps",
            "1",
        ],
        1,
        &[
            "--sequence-parallel",
            "--seq-len 15 is not divisible by --tp 2",
        ],
    );
    let args = ["train", "--steps", "2", "--format", "json"];
    let o = run_in(d, &[&args[..], &["--sequence-parallel"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("--sequence-parallel with --tp 1 changes nothing"),
        "{err}"
    );
    let losses = |s: &str| {
        s.lines()
            .filter_map(|l| {
                l.split("\"loss\":")
                    .nth(1)
                    .map(|r| r.split(',').next().unwrap_or("").to_string())
            })
            .collect::<Vec<_>>()
    };
    let with = losses(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(with.len(), 2, "{with:?}");
    assert_eq!(with, losses(&ok(d, &args)));
}
