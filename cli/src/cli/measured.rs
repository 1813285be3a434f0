//! `train`'s measured memory in the table output: one line of each device's peak (the
//! predicted side is `memory.rs`).

use pipewright::runtime::{Mesh, StepRecord};

use super::memory::human as bytes;

/// `measured peak memory: dev 0 1.20 MiB (act 0.40 MiB, buf 32.00 KiB), dev 1 …` — each device's fullest rank
/// at its highest moment, with the activations and buffers of that moment.
pub fn peak_line(step: &StepRecord, mesh: &Mesh) -> String {
    let devices = step.device_peaks(mesh);
    let parts: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(d, m)| {
            format!(
                "dev {d} {} (act {}, buf {})",
                bytes(m.total()),
                bytes(m.activations),
                bytes(m.buffers)
            )
        })
        .collect();
    format!("measured peak memory: {}", parts.join(", "))
}
