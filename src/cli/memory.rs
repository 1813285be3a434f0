//! `train`'s measured memory in the table output: one line of each device's peak.

use pipewright::runtime::{Mesh, StepRecord};

/// `1.5 KiB`, `3.0 MiB`, … (binary units, one decimal; whole bytes below 1 KiB).
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `peak memory: dev 0 1.2 MiB (activations 0.4 MiB), dev 1 …` — each device's fullest rank
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }
}
