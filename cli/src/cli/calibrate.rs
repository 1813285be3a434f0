//! `plan --calibrate FILE`: measure this machine as a cluster file for `plan --cluster FILE`.
//! The measuring is the library's (`pipewright_calibrate`); this file adds the flags' words,
//! the check and the atomic write.

use anyhow::Result;
use pipewright::calibrate::{CalibrateError, Calibration};
use pipewright::schedule::plan::Cluster;

use super::args::Device;
use super::outputs::Outputs;

/// Measure `device` (`links` gives a GPU's links, which one GPU cannot measure), print what
/// was measured, and write the cluster file.
pub fn run(mut outs: Outputs, device: Device, links: &Cluster) -> Result<()> {
    let Calibration { cluster, summary } = match device {
        Device::Cpu => pipewright::calibrate::cpu().map_err(in_words)?,
        Device::Cuda(n) => measure_cuda(n, links)?,
    };
    cluster
        .check()
        .map_err(|e| anyhow::anyhow!("calibration: {e}"))?;
    let text = serde_json::to_string_pretty(&cluster)? + "\n";
    outs.stage("--calibrate", text.as_bytes())?;
    outs.commit()?;
    super::console::println(&summary)
}

/// The library's error in the flags' words.
fn in_words(e: CalibrateError) -> anyhow::Error {
    match e {
        CalibrateError::NoGpu { .. } => anyhow::anyhow!("--calibrate --device {e}"),
        e => anyhow::anyhow!("--calibrate: {e}"),
    }
}

#[cfg(feature = "cuda")]
fn measure_cuda(ordinal: usize, links: &Cluster) -> Result<Calibration> {
    pipewright::calibrate::cuda(ordinal, links).map_err(in_words)
}

#[cfg(not(feature = "cuda"))]
fn measure_cuda(_: usize, _: &Cluster) -> Result<Calibration> {
    anyhow::bail!("--calibrate --device cuda: this pipewright was built without CUDA; rebuild with: cargo build --release --features cuda")
}
