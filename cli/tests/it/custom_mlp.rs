//! A user's own model (examples/custom_mlp.rs: an MLP regression on f32 features, no tokens)
//! trains under every schedule family over pp x dp meshes with the losses of one device
//! (1e-5, relative).

#[allow(dead_code)]
#[path = "../../../examples/custom_mlp.rs"]
mod example;

use example::{close, one_device, train};
use pipewright::kernels::layers::Parameters;
use pipewright::kernels::optim::AdamWConfig;
use pipewright::runtime::{Mesh, RunOptions};
use pipewright::schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

const LAYERS: usize = 8;
const STEPS: u64 = 3;

fn check(kind: ScheduleKind, v: u32, pp: usize, dp: usize) {
    let m = if kind == ScheduleKind::DualPipeV {
        2 * pp as u32
    } else {
        4
    };
    let tt = Checked::new(generate(
        &ScheduleSpec::new(kind, pp as u32, v, m, None).unwrap(),
    ))
    .unwrap();
    let opts = RunOptions {
        steps: STEPS,
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    };
    let what = format!("{} pp={pp} v={v} dp={dp}", tt.name);
    let got = train(Mesh::new(pp, 1, dp).unwrap(), &tt, LAYERS, &opts)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = one_device(LAYERS, dp as u32 * m, &opts).unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (step, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(close(*a, *b), "{what}: step {step}: {a} vs one device {b}");
    }
}

#[test]
fn a_user_mlp_equals_one_device_under_every_schedule_family_and_mesh() {
    for (pp, dp) in [(2, 1), (4, 1), (2, 2)] {
        for (kind, v) in [
            (ScheduleKind::GPipe, 1),
            (ScheduleKind::OneFOneB, 1),
            (ScheduleKind::Interleaved1F1B, 2),
            (ScheduleKind::LoopedBfs, 2),
            (ScheduleKind::ZbH1, 1),
            (ScheduleKind::ZbH2, 1),
            (ScheduleKind::Zbv, 2),
            (ScheduleKind::DualPipeV, 2),
        ] {
            check(kind, v, pp, dp);
        }
    }
}

/// The example's profile (what `--profile FILE` writes) is a file `plan --profile` reads:
/// every layer's parameters as the model holds them, non-zero stashes, a ranked plan.
#[test]
fn the_example_s_profile_is_planned() {
    let written = example::profile(LAYERS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.json");
    // Written without the user's own serde_json, and read back as it was.
    written.write(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let p = pipewright::schedule::LayerProfile::from_json(&text).unwrap();
    for (a, b) in p.layers.iter().zip(&written.layers) {
        // Times round-trip through JSON's decimal text to within an ulp or so.
        assert!((a.f_ms - b.f_ms).abs() <= 1e-12 * b.f_ms.abs().max(1.0));
        assert_eq!((a.params, a.stash_bytes), (b.params, b.stash_bytes));
    }
    assert_eq!(p.weight_format(), "f32");
    assert_eq!(p.len(), LAYERS);
    for (k, l) in p.layers.iter().enumerate() {
        let layer = example::layer(k, LAYERS).unwrap();
        assert_eq!(l.params, layer.num_params() as u64);
        assert_eq!(l.param_bytes, 4 * l.params);
        assert!(l.stash_bytes > 0 && l.weight_stash_bytes > 0 && l.output_bytes > 0);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipewright"))
        .args(["plan", "--profile", path.to_str().unwrap(), "--gpus", "4"])
        .args(["--global-batch", "128", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!v["rows"].as_array().unwrap().is_empty());
    // The table's header names the profile's f32 weights, not the --precision default.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipewright"))
        .args(["plan", "--profile", path.to_str().unwrap(), "--gpus", "4"])
        .args(["--global-batch", "128"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.ends_with(", f32 (the profile's weights)"),
        "{header}"
    );
}
