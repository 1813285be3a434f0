//! The memory model on the command line: what `simulate` predicts from a model shape equals
//! what `train` measures with the same flags, a byte cap of `search` bounds the whole rank,
//! and a shape given in part is refused by name.

use std::process::{Command, Output};

use serde_json::Value;

fn pipewright(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipewright"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn ok(args: &[&str]) -> String {
    let o = pipewright(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails_with(args: &[&str], needle: &str) {
    let o = pipewright(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
}

const SHAPE: [&str; 10] = [
    "--layers",
    "4",
    "--d-model",
    "32",
    "--heads",
    "4",
    "--seq-len",
    "8",
    "--vocab",
    "32",
];

#[test]
fn simulate_predicts_what_train_measures_with_the_same_flags() {
    let run: [&str; 16] = [
        "--schedule",
        "zb-h1",
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--recompute",
        "0:selective",
        "--tp",
        "2",
        "--dp",
        "2",
        "--zero",
        "1",
        "--microbatch-size",
        "3",
    ];
    let sim_args: Vec<&str> = ["simulate", "--format", "json"]
        .into_iter()
        .chain(run)
        .chain(SHAPE)
        .collect();
    let sim: Value = serde_json::from_str(&ok(&sim_args)).unwrap();
    let predicted = sim["predicted_memory"].as_array().unwrap();
    let train_args: Vec<&str> = ["train", "--format", "json", "--steps", "1"]
        .into_iter()
        .chain(run)
        .chain(SHAPE)
        .collect();
    let text = ok(&train_args);
    let step: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let measured = step["peak_stash_bytes"].as_array().unwrap();
    assert_eq!(predicted.len(), 2);
    for (d, (p, m)) in predicted.iter().zip(measured).enumerate() {
        assert_eq!(p["activations"], *m, "device {d}");
        // Four ranks a device (tp 2 x dp 2); the largest holds the predicted shard.
        let ranks = &step["optimizer_state_bytes"].as_array().unwrap()[4 * d..4 * d + 4];
        let largest = ranks.iter().filter_map(Value::as_u64).max();
        assert_eq!(p["optimizer_state"].as_u64(), largest, "device {d}");
        assert!(p["parameters"].as_u64().unwrap() > 0);
    }
    // Without a shape, the report is as it was.
    let plain = ok(&["simulate", "--format", "json", "--stages", "2"]);
    assert!(!plain.contains("predicted_memory"));
    let table = ok(&[&["simulate", "--stages", "2"][..], &SHAPE[..]].concat());
    assert!(table.contains("predicted memory per rank") && table.contains("optimizer"));
}

#[test]
fn search_caps_the_whole_rank_and_partial_shapes_are_refused_by_name() {
    let args = |cap: &'static str| -> Vec<&'static str> {
        [
            &[
                "search",
                "-p",
                "2",
                "-m",
                "4",
                "--time-budget",
                "5",
                "--memory-cap",
                cap,
            ][..],
            &SHAPE,
        ]
        .concat()
    };
    let out = ok(&args("1MiB"));
    assert!(out.contains("bounds each rank's predicted total"), "{out}");
    assert!(
        out.contains("best timetable's predicted memory per rank"),
        "{out}"
    );
    fails_with(&args("1kB"), "leaves nothing for activations");
    fails_with(
        &["simulate", "--stages", "2", "--tp", "2"],
        "--tp is for the memory model, which needs the model's shape: also give --layers",
    );
    fails_with(
        &[
            "simulate",
            "--stages",
            "2",
            "--layers",
            "4",
            "--d-model",
            "32",
        ],
        "also give --heads, --seq-len, --vocab",
    );
    fails_with(
        &[&["simulate", "--stages", "2", "--tp", "3"][..], &SHAPE].concat(),
        "memory model: tp (3) must divide heads (4)",
    );
}
