//! The cargo features' wiring: a feature that needs another must enable it, in this package
//! (whose code is gated on its own features) as in the crates it forwards to.

use std::process::Command;

use serde_json::Value;

/// The features of every workspace package, from `cargo metadata` (no network, no build).
fn workspace_features() -> Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON")
}

fn enables(meta: &Value, package: &str, feature: &str, wanted: &str) -> bool {
    let pkg = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("package {package} in the workspace"));
    pkg["features"][feature]
        .as_array()
        .unwrap_or_else(|| panic!("{package} has feature {feature}"))
        .iter()
        .any(|f| f == wanted)
}

/// Issue 12: `--features nccl` built a binary that refused `train --device cuda`, because
/// the root `nccl` feature enabled the runtime's CUDA but not the root package's own.
#[test]
fn nccl_implies_cuda_in_every_package() {
    let meta = workspace_features();
    assert!(enables(&meta, "pipewright-cli", "nccl", "cuda"));
    assert!(enables(&meta, "pipewright-cli", "cuda", "pipewright/cuda"));
    assert!(enables(&meta, "pipewright", "nccl", "cuda"));
    assert!(enables(&meta, "pipewright-runtime", "nccl", "cuda"));
    assert!(enables(
        &meta,
        "pipewright-runtime",
        "cuda",
        "pipewright-kernels/cuda"
    ));
}

/// The same, as the compiler sees it in an NCCL build (CI builds this with `--features nccl`).
#[cfg(feature = "nccl")]
#[test]
fn an_nccl_build_has_cuda() {
    assert!(cfg!(feature = "cuda"));
}
