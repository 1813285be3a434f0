//! The memory model on the command line: what `simulate` predicts from a model shape equals
//! what `train` measures with the same flags, a byte cap of `search` bounds the whole rank,
//! and a shape given in part is refused by name.

use serde_json::Value;

use crate::common;

use common::ok;

fn fails_with(args: &[&str], needle: &str) {
    common::refused(args, &[needle]);
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

/// `simulate`'s prediction and `train`'s measurement (its second step, when AdamW's state
/// exists) with the flags `run` of a 2-device pipeline with `ranks` ranks a device: each
/// device's fullest rank holds the predicted peak to the byte, every rank within 5%, and the
/// stash peaks are equal.
fn prediction_is_measured(run: &[&str], ranks: usize) {
    let sim_args: Vec<&str> = ["simulate", "--format", "json"]
        .into_iter()
        .chain(run.iter().copied())
        .chain(SHAPE)
        .collect();
    let sim: Value = serde_json::from_str(&ok(&sim_args)).unwrap();
    let predicted = sim["predicted_memory"].as_array().unwrap();
    let train_args: Vec<&str> = ["train", "--format", "json", "--steps", "2"]
        .into_iter()
        .chain(run.iter().copied())
        .chain(SHAPE)
        .collect();
    let text = ok(&train_args);
    let step: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 1);
    let stashes = step["peak_stash_bytes"].as_array().unwrap();
    let memory = step["memory"].as_array().unwrap();
    assert_eq!(predicted.len(), 2);
    let total = |m: &Value| -> u64 {
        let keys = [
            "parameters",
            "gradients",
            "optimizer_state",
            "activations",
            "buffers",
        ];
        keys.iter().map(|k| m[*k].as_u64().unwrap()).sum()
    };
    for (d, p) in predicted.iter().enumerate() {
        assert!(
            p["activations"].as_u64() <= stashes[d].as_u64(),
            "device {d}"
        );
        let device = &memory[ranks * d..ranks * (d + 1)];
        let fullest = device.iter().map(|r| &r["peak"]).max_by_key(|m| total(m));
        assert_eq!(fullest, Some(p), "device {d}: {run:?}");
        for r in device {
            let (m, want) = (total(&r["peak"]) as f64, total(p) as f64);
            assert!((m - want).abs() <= 0.05 * m, "device {d}: {r} {p}");
        }
    }
}

#[test]
fn simulate_predicts_what_train_measures_with_the_same_flags() {
    let run = [
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
    prediction_is_measured(&run, 4);
    // Sequence parallelism, with full recomputation of the first stage.
    let sp = [
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--recompute",
        "0:full",
        "--tp",
        "2",
        "--sequence-parallel",
        "--microbatch-size",
        "2",
    ];
    prediction_is_measured(&sp, 2);
    // Without a shape, the report is as it was.
    let plain = ok(&["simulate", "--format", "json", "--stages", "2"]);
    assert!(!plain.contains("predicted_memory"));
    let table = ok(&[&["simulate", "--stages", "2"][..], &SHAPE[..]].concat());
    assert!(table.contains("predicted memory per rank") && table.contains("buffers"));
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
    // Said once: the error is not its own cause.
    let line = common::refused(
        &[&["simulate", "--stages", "2", "--tp", "3"][..], &SHAPE].concat(),
        &["memory model: tp (3) must divide heads (4)"],
    );
    assert_eq!(
        line.trim_end(),
        "error: memory model: tp (3) must divide heads (4)"
    );
}
