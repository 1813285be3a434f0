//! The `pipewright` binary end to end: outputs people and programs read, and bad input.

use std::process::Output;

use crate::common;

fn pipewright(args: &[&str]) -> Output {
    common::run(args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exits 1 with exactly one `error: ` line on stderr that contains `needle`, and no panic.
fn assert_clean_error(args: &[&str], needle: &str) {
    common::refused(args, &[needle]);
}

#[test]
fn simulate_json_carries_the_documented_fields() {
    let o = pipewright(&[
        "simulate",
        "--schedule",
        "1f1b",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["makespan"], 33.0);
    assert_eq!(v["ideal"], 24.0);
    assert!((v["bubble_fraction"].as_f64().unwrap() - 3.0 / 11.0).abs() < 1e-12);
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 4);
    for (r, d) in devices.iter().enumerate() {
        assert_eq!(d["peak_activations"], 4 - r as u64);
        assert!(d["bubble_fraction"].is_number());
    }
}

#[test]
fn schedule_csv_validates_and_simulates_as_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("tt.csv");
    let csv = csv.to_str().unwrap();
    let o = pipewright(&[
        "schedule",
        "--schedule",
        "interleaved-1f1b",
        "-p",
        "2",
        "-v",
        "2",
        "-m",
        "5",
        "--comms",
        "--format",
        "csv",
        "-o",
        csv,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // PyTorch's compute+comms form reads back as its compute order.
    let o = pipewright(&["validate", csv, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (
            v["valid"].as_bool(),
            v["stages"].as_u64(),
            v["lowered"].as_bool()
        ),
        (Some(true), Some(4), Some(false))
    );
    let from_file = pipewright(&["simulate", "--timetable", csv, "--format", "json"]);
    let generated = pipewright(&[
        "simulate",
        "--schedule",
        "interleaved-1f1b",
        "-p",
        "2",
        "-v",
        "2",
        "-m",
        "5",
        "--format",
        "json",
    ]);
    assert_eq!(stdout(&from_file), stdout(&generated));
}

#[test]
fn simulate_writes_timeline_and_chrome_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (tl, tr) = (dir.path().join("tl.json"), dir.path().join("trace.json"));
    let o = pipewright(&[
        "simulate",
        "-p",
        "3",
        "-m",
        "4",
        "--p2p-latency",
        "0.1",
        "--timeline",
        tl.to_str().unwrap(),
        "--trace",
        tr.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let timeline: pipewright::schedule::Timeline =
        serde_json::from_slice(&std::fs::read(tl).unwrap()).unwrap();
    assert_eq!(timeline.compute_events().count(), 2 * 3 * 4);
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(tr).unwrap()).unwrap();
    assert!(trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["ph"] == "f"));
}

#[test]
fn bad_input_is_one_clear_line_and_a_nonzero_exit() {
    assert_clean_error(
        &["simulate", "--microbatches", "0"],
        "--microbatches (m) must be at least 1",
    );
    assert_clean_error(
        &["simulate", "--stages", "0"],
        "--stages (devices p) must be at least 1",
    );
    assert_clean_error(
        &["schedule", "--virtual", "0"],
        "--virtual (chunks per device v) must be at least 1",
    );
    assert_clean_error(
        &["simulate", "--schedule", "gpipe", "--virtual", "2"],
        "gpipe places one stage per device",
    );
    assert_clean_error(
        &["schedule", "--schedule", "1f1b", "--virtual", "2"],
        "1f1b places one stage per device",
    );
    assert_clean_error(
        &["simulate", "--schedule", "zero-bubble"],
        "unknown schedule `zero-bubble`",
    );
    assert_clean_error(
        &[
            "simulate",
            "--schedule",
            "interleaved-1f1b",
            "-p",
            "4",
            "-v",
            "2",
            "-m",
            "3",
        ],
        "needs at least p=4 microbatches",
    );
    assert_clean_error(
        &["simulate", "--cost", "1,-2"],
        "b must be a finite number >= 0",
    );
    assert_clean_error(
        &["simulate", "--bandwidth", "0"],
        "bandwidth must be a finite number > 0",
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "0F0,0B0\n1F0,1B0,1Z0\n").unwrap();
    assert_clean_error(
        &["validate", bad.to_str().unwrap()],
        "line 2, column 9: `1Z0` has no known action kind",
    );
    std::fs::write(&bad, "0F0,0F0,0B0\n").unwrap();
    assert_clean_error(
        &["validate", bad.to_str().unwrap()],
        "bad.csv:1:5: device 0, step 1 (0F0): duplicated",
    );
    let costs = dir.path().join("c.json");
    std::fs::write(&costs, "{\"default\": {\"f\": 1}}").unwrap();
    assert_clean_error(
        &["simulate", "--cost-file", costs.to_str().unwrap()],
        "stage 0: no b, or i and w given",
    );
}

#[test]
fn validate_grid_marks_the_failing_step() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("dead.csv");
    std::fs::write(
        &bad,
        "0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
    )
    .unwrap();
    let o = pipewright(&["validate", bad.to_str().unwrap(), "--grid"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains(">0RECV_B0<"), "{err}");
    assert!(err.lines().last().unwrap().contains("deadlock"), "{err}");
}

#[test]
fn failed_write_leaves_the_old_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tt.csv");
    std::fs::write(&out, "0F0,0B0\n").unwrap();
    let o = pipewright(&[
        "schedule",
        "-m",
        "0",
        "--format",
        "csv",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "0F0,0B0\n");
    let o = pipewright(&[
        "schedule",
        "--format",
        "csv",
        "-o",
        dir.path().join("no/such/dir.csv").to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("does not exist; create it first"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn viz_writes_svg_with_one_box_per_compute_action_and_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("c.svg");
    let o = pipewright(&[
        "viz",
        "--schedule",
        "interleaved-1f1b",
        "-p",
        "4",
        "-v",
        "2",
        "-m",
        "8",
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<svg") || text.starts_with("<?xml"),
        "{}",
        &text[..40]
    );
    // 8 stages x 8 microbatches, each with one F and one B: 128 compute boxes.
    assert_eq!(text.matches(r#"class="act F""#).count(), 64);
    assert_eq!(text.matches(r#"class="act B""#).count(), 64);
    let png = dir.path().join("c.png");
    let o = pipewright(&[
        "viz",
        "--compare",
        "gpipe,1f1b",
        "-p",
        "3",
        "-m",
        "4",
        "--memory",
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    assert_clean_error(
        &["viz", "-o", dir.path().join("c.gif").to_str().unwrap()],
        "use a .svg or .png file name",
    );
}

#[test]
fn viz_draws_a_saved_timeline_on_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("tl.json");
    assert!(pipewright(&[
        "simulate",
        "-p",
        "2",
        "-m",
        "3",
        "--timeline",
        tl.to_str().unwrap()
    ])
    .status
    .success());
    let o = pipewright(&["viz", "--from", tl.to_str().unwrap(), "--columns", "80"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().all(|l| l.chars().count() <= 80), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("dev ")).count(),
        2,
        "{out}"
    );
}

#[test]
fn sweep_json_and_csv_carry_the_same_rows_and_the_closed_form() {
    let args = [
        "sweep",
        "--schedules",
        "1f1b,interleaved-1f1b",
        "-p",
        "4",
        "-v",
        "2",
        "-m",
        "1..32:x2",
    ];
    let json = pipewright(&[&args[..], &["--format", "json"]].concat());
    assert!(json.status.success(), "{}", stderr(&json));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&json)).unwrap();
    let csv = stdout(&pipewright(&[&args[..], &["--format", "csv"]].concat()));
    let lines: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 12);
    assert_eq!(lines.len(), rows.len());
    let mut last = f64::INFINITY;
    for (row, line) in rows.iter().zip(&lines) {
        let cells: Vec<&str> = line.splitn(12, ',').collect();
        assert_eq!(cells[0], row["schedule"]);
        assert_eq!(cells[2], row["microbatches"].to_string());
        match row["bubble_fraction"].as_f64() {
            Some(b) => {
                assert_eq!(cells[4].parse::<f64>().unwrap(), b);
                let steady = row["bubble"]["steady_state"].as_f64().unwrap();
                assert_eq!(cells[6].parse::<f64>().unwrap(), steady);
                assert_eq!(row["bubble"]["single_step"].as_f64().unwrap(), b);
                assert!(steady <= b + 1e-12);
            }
            None => assert!(cells[11].contains("needs at least p=4"), "{line}"),
        }
        if row["schedule"] == "1f1b" {
            let m = row["microbatches"].as_f64().unwrap();
            let b = row["bubble_fraction"].as_f64().unwrap();
            assert!((b - 3.0 / (m + 3.0)).abs() < 1e-12 && b < last);
            // Unfenced 1F1B steps repeat every makespan: both bubbles agree.
            let steady = row["bubble"]["steady_state"].as_f64().unwrap();
            assert!((steady - b).abs() < 1e-12, "{row}");
            last = b;
        }
    }
    assert_clean_error(
        &["sweep", "--memory-cap", "100"],
        "--memory-cap needs activation sizes",
    );
    assert_clean_error(
        &["sweep", "-m", "8..4"],
        "--microbatches: `8..4`: range 8..4 runs backwards",
    );
}

/// The README's main job, as written there: its loss must fall below half its first value.
#[test]
fn readme_training_run_halves_its_loss_and_draws_its_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart.png");
    let o = pipewright(&[
        "train",
        "--schedule",
        "interleaved-1f1b",
        "--stages",
        "2",
        "--virtual",
        "2",
        "--microbatches",
        "8",
        "--steps",
        "60",
        "--chart",
        chart.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let losses: Vec<f64> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(losses.len(), 60);
    assert!(
        losses[59] < losses[0] / 2.0,
        "{} -> {}",
        losses[0],
        losses[59]
    );
    assert_eq!(&std::fs::read(&chart).unwrap()[..4], b"\x89PNG");
}

/// `train --zero 1` prints the losses of `--zero 0` exactly (JSON prints f32s exactly), and
/// each of its 4 ranks (pp 2 x dp 2) reports half the optimizer state of `--zero 0`'s.
#[test]
fn train_zero1_prints_zero0s_losses_with_half_the_optimizer_state_per_rank() {
    let run = |zero: &str| {
        let args = [
            "train",
            "--stages",
            "2",
            "--dp",
            "2",
            "--microbatches",
            "4",
            "--steps",
            "3",
            "--format",
            "json",
            "--zero",
            zero,
        ];
        let o = pipewright(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows: Vec<serde_json::Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let losses: Vec<String> = rows.iter().map(|r| r["loss"].to_string()).collect();
        let bytes: Vec<u64> = rows[2]["optimizer_state_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        (losses, bytes)
    };
    let (want, full) = run("0");
    let (got, half) = run("1");
    assert_eq!(got, want);
    assert_eq!(full.len(), 4);
    for (h, f) in half.iter().zip(&full) {
        assert!(
            *h > 0 && (*h as f64 - *f as f64 / 2.0).abs() <= 8.0,
            "{half:?} vs {full:?}"
        );
    }
    let o = pipewright(&["train", "--stages", "2", "--zero", "1", "--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: --zero 1 with --dp 1 changes nothing"));
}

#[test]
fn train_rejects_meshes_and_models_that_do_not_fit() {
    assert_clean_error(
        &["train", "--stages", "2", "--tp", "3", "--steps", "1"],
        "tensor-parallel size 3 must divide n_heads (4)",
    );
    assert_clean_error(
        &["train", "--stages", "4", "--layers", "2", "--steps", "1"],
        "4 stages need at least 4 layers",
    );
    assert_clean_error(
        &["train", "--stages", "2", "--dp", "0", "--steps", "1"],
        "--dp 0: must be at least 1",
    );
}

#[test]
fn transport_mpi_needs_the_feature_and_a_world_of_the_mesh_size() {
    let train = [
        "train",
        "--transport",
        "mpi",
        "--stages",
        "2",
        "--steps",
        "1",
    ];
    let bench = [
        "bench",
        "--transport",
        "mpi",
        "--stages",
        "2",
        "--steps",
        "1",
    ];
    // Without the feature: say how to get it. With it, a launch without mpirun is a world of
    // one: say how to launch.
    let needle = if cfg!(feature = "mpi") {
        "but the world has 1: launch 2 processes, e.g. mpirun -np 2"
    } else {
        "rebuild with MPI: cargo build --release --features mpi"
    };
    assert_clean_error(&train, needle);
    assert_clean_error(&bench, needle);
}

fn json_losses(o: &Output) -> Vec<f64> {
    stdout(o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

#[test]
fn precision_trains_in_bf16_and_refuses_unknown_names() {
    let run = |p: &str| {
        let o = pipewright(&[
            "train",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--steps",
            "12",
            "--format",
            "json",
            "--precision",
            p,
        ]);
        assert!(o.status.success(), "{p}: {}", stderr(&o));
        json_losses(&o)
    };
    let (f32_run, default, bf16) = (
        run("f32"),
        json_losses(&pipewright(&[
            "train",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--steps",
            "12",
            "--format",
            "json",
        ])),
        run("bf16"),
    );
    assert_eq!(default, f32_run, "f32 is the default");
    assert_ne!(bf16, f32_run, "bf16 rounds");
    assert!(bf16[11] < 0.8 * bf16[0], "bf16 learns: {bf16:?}");
    let bad = pipewright(&["train", "--precision", "fp16", "--steps", "1"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = stderr(&bad);
    assert!(
        err.contains("invalid value 'fp16' for '--precision")
            && err.contains("[possible values: f32, tf32, bf16]"),
        "{err}"
    );
}

#[test]
fn device_cuda_needs_the_feature_and_a_gpu_and_a_known_name() {
    let train = ["train", "--device", "cuda", "--stages", "2", "--steps", "1"];
    // Without the feature: say how to get it. With it, on a machine without a GPU: say which
    // library is missing (a machine with a GPU trains instead, so the check is skipped).
    if !cfg!(feature = "cuda") {
        assert_clean_error(
            &train,
            "rebuild with: cargo build --release --features cuda",
        );
    }
    // Any build with CUDA (an NCCL build included: issue 12) takes --device cuda: it trains
    // on a GPU, or names what is missing.
    if cfg!(feature = "cuda") {
        let o = pipewright(&train);
        assert!(!stderr(&o).contains("built without CUDA"), "{}", stderr(&o));
    }
    // A bad name is clap's usage error (exit 2), naming the flag and the choices.
    let bad = pipewright(&["train", "--device", "gpu", "--steps", "1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("`gpu` is not a device: use cpu, cuda or cuda:N"));
    assert_clean_error(
        &[
            "train",
            "--device",
            "cuda",
            "--transport",
            "mpi",
            "--steps",
            "1",
        ],
        "--transport mpi moves CPU tensors: for GPUs across processes use --transport nccl",
    );
}

#[test]
fn transport_nccl_needs_both_features_and_a_world_of_the_mesh_size() {
    let train = [
        "train",
        "--transport",
        "nccl",
        "--stages",
        "2",
        "--steps",
        "1",
    ];
    // Without NCCL and MPI: say how to get both. With them, a launch without mpirun is a
    // world of one, refused before any GPU is touched: say how to launch.
    let needle = if cfg!(all(feature = "nccl", feature = "mpi")) {
        "but the world has 1: launch 2 processes, e.g. mpirun -np 2"
    } else {
        r#"rebuild with: cargo build --release --features "nccl mpi""#
    };
    assert_clean_error(&train, needle);
    // Whatever the build: flags that cannot mean anything over NCCL are refused first.
    let with = |extra: &[&'static str]| [&train[..], extra].concat();
    assert_clean_error(
        &with(&["--device", "cpu"]),
        "--transport nccl moves GPU tensors",
    );
    assert_clean_error(
        &with(&["--device", "cuda:1"]),
        "each rank on the GPU of its local rank",
    );
    assert_clean_error(
        &["bench", "--transport", "nccl", "--steps", "1"],
        "bench runs synthetic stages on host tensors",
    );
}

/// A cost file's times are in its `time_unit`, and the simulator's report says so (it said
/// "units" for a file in ms); flags' costs stay in abstract units.
#[test]
fn simulate_reports_the_cost_file_s_time_unit() {
    let dir = tempfile::tempdir().unwrap();
    let costs = dir.path().join("c.json");
    let text = "{\"default\": {\"f\": 1, \"b\": 2}, \"time_unit\": \"ms\"}";
    std::fs::write(&costs, text).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["simulate", "--schedule", "1f1b", "--stages", "2"];
        args.extend_from_slice(&["--microbatches", "4", "--format", "json"]);
        args.extend_from_slice(extra);
        let o = pipewright(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["time_unit"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(run(&["--cost-file", costs.to_str().unwrap()]), "ms");
    assert_eq!(run(&[]), "units");
}
