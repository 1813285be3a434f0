//! `pipewright plan` end to end: the table and its launch line, JSON with every row, a
//! cluster file, and one-line refusals.

use crate::common;

use common::plan::{ok, refused};

const SMALL: [&str; 10] = [
    "--layers",
    "24",
    "--d-model",
    "2048",
    "--heads",
    "16",
    "--seq-len",
    "2048",
    "--gpus",
    "16",
];

#[test]
fn the_table_ends_with_a_launch_line_train_accepts() {
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "128", "--explain", "--top", "3"]);
    // Sequence parallelism fixed on, so the launch line carries it too.
    args.extend(["--tp", "2", "--sequence-parallel"]);
    let out = ok(&args);
    assert!(
        out.contains("TFLOP/s/GPU") && out.contains("why the best"),
        "{out}"
    );
    let launch = out
        .lines()
        .find(|l| l.trim_start().starts_with("mpirun -np 16 pipewright train"))
        .unwrap_or_else(|| panic!("no launch line in {out}"));
    // Every flag of the launch line is one `train` knows: its --help lists it.
    let help = common::ok(&["train", "--help"]);
    for flag in launch.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "train has no {flag}");
    }
    assert!(launch.contains("--transport nccl") && launch.contains(" --sequence-parallel "));
}

#[test]
fn json_carries_every_row_and_the_launch() {
    let mut args = SMALL.to_vec();
    args.extend([
        "--global-batch",
        "128",
        "--format",
        "json",
        "--cluster",
        "h100-80g",
    ]);
    let out = ok(&args);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.len() <= 5);
    let best = &rows[0];
    for key in [
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "mfu",
        "peak_memory_bytes",
        "bubble",
    ] {
        assert!(best[key].as_f64().is_some(), "{key} missing: {best}");
    }
    assert!(
        best["memory"].as_array().unwrap().len() as u64 == best["config"]["pp"].as_u64().unwrap()
    );
    assert!(best["terms"]["compute"].as_f64().unwrap() > 0.0);
    assert!(best["limit"].is_string());
    assert_eq!(v["cluster"]["name"], "h100-80g");
    assert!(v["launch"].as_str().unwrap().starts_with("mpirun -np 16"));
}

#[test]
fn a_cluster_file_is_read_and_its_errors_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("c.json");
    std::fs::write(
        &good,
        r#"{ "name": "small", "gpus_per_node": 4, "memory_gib": 24,
             "peak_tflops": { "bf16": 100, "tf32": 50, "f32": 10 },
             "memory_bandwidth_gbs": 900,
             "intra_node": { "bandwidth_gbs": 50, "latency_us": 5 },
             "inter_node": { "bandwidth_gbs": 10, "latency_us": 10 } }"#,
    )
    .unwrap();
    let mut args = SMALL.to_vec();
    let path = good.to_str().unwrap();
    args.extend(["--global-batch", "64", "--cluster", path]);
    let out = ok(&args);
    assert!(out.contains("of small (4 per node, 24 GiB)"), "{out}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{ "name": "x", "gpus_per_node": 0 }"#).unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "64", "--cluster", bad.to_str().unwrap()]);
    refused(&args, &["--cluster", "line 1"]);
}

#[test]
fn impossible_requests_are_one_line() {
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "64", "--tp", "3"]);
    refused(
        &args,
        &["--tp 3", "16 heads", "TP sizes that can: 1, 2, 4, 8"],
    );
    refused(
        &[
            "--layers",
            "128",
            "--d-model",
            "25600",
            "--heads",
            "160",
            "--seq-len",
            "2048",
            "--gpus",
            "64",
            "--global-batch",
            "64",
        ],
        &["needs 16.5 TiB of model state", "more 80 GiB GPUs"],
    );
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "0"]);
    refused(&args, &["--global-batch must be at least 1"]);
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "64", "--cluster", "b200"]);
    refused(&args, &["neither a preset (a100-80g, h100-80g) nor a file"]);
}

#[test]
fn the_best_is_drawn_and_its_memory_listed_per_device() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("best.png");
    let mut args = SMALL.to_vec();
    let path = png.to_str().unwrap();
    args.extend([
        "--global-batch",
        "128",
        "--pp",
        "4",
        "--memory",
        "--chart",
        path,
    ]);
    let out = ok(&args);
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    let rows = out
        .lines()
        .skip_while(|l| !l.starts_with("memory of the best"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .count();
    assert_eq!(rows, 4, "one row per pipeline device: {out}");
    // The SVG form carries the memory panel: one bar per pipeline device, by category.
    let svg = dir.path().join("best.svg");
    let mut args = SMALL.to_vec();
    args.extend([
        "--global-batch",
        "128",
        "--pp",
        "4",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    ok(&args);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("predicted peak memory per pipeline device") && text.contains("activations"),
        "no memory panel"
    );
    let bad = dir.path().join("best.gif");
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "128", "--chart", bad.to_str().unwrap()]);
    refused(&args, &["--chart"]);
}

#[test]
fn calibrate_writes_a_cluster_file_plan_reads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("local.json");
    let path = file.to_str().unwrap();
    let out = ok(&["--calibrate", path]);
    assert!(out.contains("GFLOP/s"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["name"], "local-cpu");
    assert!(v["peak_tflops"]["f32"].as_f64().unwrap() > 0.0);
    let out = ok(&[
        "--cluster",
        path,
        "--layers",
        "4",
        "--d-model",
        "64",
        "--heads",
        "4",
        "--seq-len",
        "16",
        "--vocab",
        "64",
        "--gpus",
        "1",
        "--global-batch",
        "8",
        "--precision",
        "f32",
    ]);
    assert!(out.contains("of local-cpu"), "{out}");
    refused(
        &["--calibrate", dir.path().join("x.txt").to_str().unwrap()],
        &["--calibrate"],
    );
    refused(
        &["--layers", "4"],
        &["required arguments were not provided: --d-model <H>"],
    );
}

/// `--device` names what `--calibrate` measures; without `--calibrate` it is refused, and a
/// GPU asked of a CPU-only build is one line saying how to get one (CI runs the CUDA build's
/// own refusal, where no GPU is present, in .ci/run).
#[test]
fn calibrate_device_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu.json");
    let path = file.to_str().unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "16", "--device", "cuda"]);
    refused(&args, &["--calibrate <FILE>"]);
    refused(
        &["--calibrate", path, "--device", "gpu0"],
        &["`gpu0` is not a device"],
    );
    if cfg!(not(feature = "cuda")) {
        refused(
            &["--calibrate", path, "--device", "cuda:0"],
            &["built without CUDA", "--features cuda"],
        );
    }
    assert!(!file.exists(), "a refused calibration wrote its file");
}

#[test]
fn validate_trains_configurations_and_ranks_them() {
    let out = ok(&[
        "--layers",
        "2",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--vocab",
        "32",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--precision",
        "f32",
        "--validate",
        "3",
    ]);
    assert!(out.contains("validation: "), "{out}");
    let measured = out
        .lines()
        .skip_while(|l| !l.starts_with("validation: "))
        .skip(2)
        .take_while(|l| !l.starts_with("largest") && !l.starts_with("Spearman"))
        .count();
    assert!((2..=3).contains(&measured), "{out}");
    assert!(out.contains("Spearman rank correlation"), "{out}");
    // The memory model's Pipewright accounting against train's measured peaks: within 5%.
    let err: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("largest error of a device's predicted peak memory against its fullest rank's measured peak: "))
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no memory line in {out}"));
    assert!(err <= 5.0, "{out}");
    // Sequence parallelism asked for is trained with, and predicted as trained.
    let out = ok(&[
        "--layers",
        "2",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--vocab",
        "32",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--sequence-parallel",
        "--global-batch",
        "8",
        "--precision",
        "f32",
        "--validate",
        "2",
    ]);
    let rows: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("validation: "))
        .skip(2)
        .take_while(|l| !l.starts_with("largest") && !l.starts_with("Spearman"))
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r.ends_with(" sp")),
        "{out}"
    );
    assert!(rows.iter().all(|r| r.contains(" 0.0% ")), "{out}");
    let mut args = SMALL.to_vec();
    args.extend(["--global-batch", "64", "--validate", "1"]);
    refused(&args, &["--validate needs at least 2"]);
}
