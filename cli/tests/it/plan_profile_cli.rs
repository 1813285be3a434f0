//! `pipewright plan --profile`: a layer-list model planned from its profile file. A ranked
//! plan with tp 1 and the launch as the user's own program with the cuts; a fixed `--pp`
//! kept; MFU only where FLOPs are given; a model that fits nowhere, a bad file and flags a
//! profile cannot take each refused in one line.

use std::path::Path;

use serde_json::{json, Value};

use crate::common;

use common::plan::{ok, refused, run};

/// A profile of `n` layers of `params` parameters each (f32), measured at microbatches of
/// 4 samples; the middle layers slower, so time-balanced cuts are uneven in layers.
fn profile(n: usize, params: u64, flops: bool) -> Value {
    let layers: Vec<Value> = (0..n)
        .map(|k| {
            let slow = if (n / 3..2 * n / 3).contains(&k) {
                2.0
            } else {
                1.0
            };
            let mut l = json!({
                "f_ms": 4.0 * slow, "i_ms": 4.0 * slow, "w_ms": 3.0 * slow,
                "params": params, "param_bytes": 4 * params,
                "stash_bytes": 256u64 << 20, "weight_stash_bytes": 64u64 << 20,
                "output_bytes": 32u64 << 20,
            });
            if flops {
                l["flops"] = json!(2.0 * 4.0 * params as f64 * 512.0);
            }
            l
        })
        .collect();
    json!({"version": 1, "microbatch_size": 4, "device": "test GPU", "layers": layers})
}

fn write(dir: &Path, name: &str, v: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(v).unwrap()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_profile_gets_a_ranked_plan_and_the_user_s_own_launch() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "p.json", &profile(12, 50_000_000, true));
    let out = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["batch_unit"], "samples");
    assert_eq!(v["model"]["profile"]["layers"], 12);
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let steps: Vec<f64> = rows
        .iter()
        .map(|r| r["step_time_s"].as_f64().unwrap())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    for r in rows {
        let c = &r["config"];
        assert_eq!(
            (c["tp"].as_u64(), c["sequence_parallel"].as_bool()),
            (Some(1), Some(false))
        );
        assert_eq!(c["microbatch_size"], 4, "the profile's size unless fixed");
        assert!(
            matches!(c["recompute"].as_str(), Some("none" | "full")),
            "{c}"
        );
        assert!(r["mfu"].as_f64().is_some_and(|m| m > 0.0 && m < 1.0), "{r}");
        assert!(r["tokens_per_s"].is_null());
        let samples = r["samples_per_s"].as_f64().unwrap();
        let step = r["step_time_s"].as_f64().unwrap();
        assert!((samples * step / 256.0 - 1.0).abs() < 1e-9);
    }
    // The launch: the best's mesh and microbatches, and cuts covering every layer in order.
    let (best, launch) = (&rows[0]["config"], &v["launch"]);
    for key in ["pp", "v", "dp", "microbatches", "schedule", "zero"] {
        assert_eq!(launch[key], best[key], "{key}");
    }
    let cuts = launch["cuts"].as_array().unwrap();
    let stages = best["pp"].as_u64().unwrap() * best["v"].as_u64().unwrap();
    assert_eq!(cuts.len() as u64, stages);
    let mut next = 0;
    for c in cuts {
        assert_eq!(c[0].as_u64(), Some(next));
        assert!(c[1].as_u64().unwrap() > next);
        next = c[1].as_u64().unwrap();
    }
    assert_eq!(next, 12);

    let table = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--explain",
    ]);
    assert!(
        table.contains("samples/s") && table.contains("your own program"),
        "{table}"
    );
    assert!(
        table.contains("Mesh::new(") && !table.contains("train --transport"),
        "{table}"
    );
    // The explanation names only dimensions a layer-list model has (no TP, no SP).
    let why = &table[table.find("why the best").expect("an explanation")..];
    assert!(
        !why.contains("--tp") && !why.contains("--sequence-parallel"),
        "{why}"
    );
}

#[test]
fn a_fixed_pp_is_kept_and_mfu_needs_flops() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "p.json", &profile(12, 50_000_000, false));
    let out = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--pp",
        "4",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r["config"]["pp"], 4);
        assert!(r["mfu"].is_null() && r["tflops_per_gpu"].is_null(), "{r}");
    }
    let table = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--pp",
        "4",
    ]);
    assert!(table.contains("n/a"), "{table}");
    // A larger microbatch than profiled: its times scale linearly, so a microbatch of 8
    // takes twice as long and the same batch needs half the microbatches.
    let out = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--microbatch-size",
        "8",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["config"]["microbatch_size"] == 8));
    // The same configuration at 4 and 8 samples a microbatch, no pipeline: half the
    // microbatches of twice the time is the same step, and the one microbatch in flight
    // stashes twice the bytes.
    let at = |mbs: &str| {
        let out = ok(&[
            "--profile",
            &file,
            "--gpus",
            "16",
            "--global-batch",
            "256",
            "--pp",
            "1",
            "--zero",
            "0",
            "--recompute",
            "none",
            "--microbatch-size",
            mbs,
            "--format",
            "json",
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        let r = &v["rows"][0];
        (
            r["config"]["microbatches"].as_u64().unwrap(),
            r["step_time_s"].as_f64().unwrap(),
            r["memory"][0]["activations"].as_u64().unwrap(),
        )
    };
    let ((m4, step4, act4), (m8, step8, act8)) = (at("4"), at("8"));
    assert_eq!((m4, m8), (4, 2));
    assert!((step8 / step4 - 1.0).abs() < 1e-12, "{step4} vs {step8}");
    assert_eq!(act8, 2 * act4);
}

#[test]
fn a_model_that_fits_nowhere_and_bad_input_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // 24 layers of 5 billion parameters: 1.9 TB of f32 state with AdamW.
    let huge = write(dir.path(), "huge.json", &profile(24, 5_000_000_000, false));
    refused(
        &["--profile", &huge, "--gpus", "8", "--global-batch", "64"],
        &["needs ", "of model state", "more 80 GiB GPUs"],
    );
    let mut bad = profile(4, 1000, false);
    bad["layers"][2]["i_ms"] = json!(-1.0);
    let bad = write(dir.path(), "bad.json", &bad);
    refused(
        &["--profile", &bad, "--gpus", "2", "--global-batch", "8"],
        &[
            "bad.json",
            "profile: layer 2: i_ms must be 0 or from 0.000001 to 10000000 ms, as a layer can take (got -1)",
        ],
    );
    let path = dir.path().join("broken.json");
    std::fs::write(&path, "{\"version\": 1,\n \"layers\": [}").unwrap();
    refused(
        &[
            "--profile",
            path.to_str().unwrap(),
            "--gpus",
            "2",
            "--global-batch",
            "8",
        ],
        &["profile, line 2, column"],
    );
    let file = write(dir.path(), "p.json", &profile(4, 1000, false));
    refused(
        &[
            "--profile",
            &file,
            "--gpus",
            "2",
            "--global-batch",
            "8",
            "--recompute",
            "selective",
        ],
        &["--recompute selective", "fully or not at all"],
    );
    // The batch must split into microbatches of the profile's 4 samples.
    refused(
        &["--profile", &file, "--gpus", "2", "--global-batch", "6"],
        &["global batch 6 samples", "nearest batch that works: 4 or 8"],
    );
    let o = run(&[
        "--profile",
        &file,
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--layers",
        "4",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"));
    // A profile's rows are never searched: --timetable-out could never be written.
    let o = run(&[
        "--profile",
        &file,
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--timetable-out",
        "best.csv",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("cannot be used with '--timetable-out <FILE>'"),
        "{err}"
    );
}

/// Sizes each in range whose scaled stashes pass what `u64` holds: refused as not fitting
/// (once a panic on the memory total's overflow, and in release a wrapped total that fit).
#[test]
fn a_microbatch_scaled_past_u64_bytes_is_refused_not_overflowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = profile(2, 1000, false);
    for l in p["layers"].as_array_mut().unwrap() {
        l["stash_bytes"] = json!(1u64 << 48);
    }
    let file = write(dir.path(), "p.json", &p);
    refused(
        &[
            "--profile",
            &file,
            "--gpus",
            "2",
            "--global-batch",
            "1073741824",
            "--microbatch-size",
            "536870912",
        ],
        &["needs "],
    );
}

/// A profile measured on one rank of tp 2 (`"tp": 2`, its bytes that rank's shard) is
/// planned at tp 2 alone, and its launch is for that mesh.
#[test]
fn a_profile_measured_at_tp_2_is_planned_at_tp_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = profile(12, 50_000_000, false);
    p["tp"] = json!(2);
    let file = write(dir.path(), "p.json", &p);
    let out = ok(&[
        "--profile",
        &file,
        "--gpus",
        "16",
        "--global-batch",
        "256",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let c = &r["config"];
        assert_eq!(
            (c["tp"].as_u64(), c["sequence_parallel"].as_bool()),
            (Some(2), Some(false)),
            "{c}"
        );
    }
    assert_eq!(v["launch"]["tp"], 2);
    let table = ok(&["--profile", &file, "--gpus", "16", "--global-batch", "256"]);
    let (pp, dp) = (&v["launch"]["pp"], &v["launch"]["dp"]);
    let mesh = format!("Mesh::new({pp}, 2, {dp})");
    assert!(table.contains(&mesh), "{mesh} in {table}");
    // GPUs that tp 2 does not divide are refused for that reason.
    refused(
        &["--profile", &file, "--gpus", "3", "--global-batch", "12"],
        &["the profile was measured at tp 2 (one TP rank's layers), which 3 GPUs"],
    );
}
