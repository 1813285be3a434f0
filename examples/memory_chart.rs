//! Measured memory per device of the reference GPT under 1F1B on 4 pipeline devices, with
//! and without full activation recomputation: the chart of README's "Memory" section.
//!
//! `cargo run --release --example memory_chart -- docs/memory.png` trains both runs (2
//! steps each, on the CPU) and draws each device's peak by category; it prints the peaks.

use std::path::PathBuf;

use pipewright::kernels::gpt::GptConfig;
use pipewright::runtime::{train_gpt, Mesh, RunOptions, StepRecord, TrainConfig};
use pipewright::schedule::memory::MemoryBreakdown;
use pipewright::schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
use pipewright::viz::{memory_bars, ChartOptions, ImageFormat, MemoryBars};

/// Each device's peak in the last step of 1F1B (p = 4, m = 8) under `recompute`.
fn peaks(recompute: &str) -> Result<Vec<MemoryBreakdown>, Box<dyn std::error::Error>> {
    let mesh = Mesh::new(4, 1, 1)?;
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None)?;
    let cfg = TrainConfig {
        mesh,
        // vocab 256, seq 64, d_model 128, 4 heads, 8 layers.
        model: GptConfig::new(256, 64, 128, 4, 8),
        microbatch_size: 4,
        seed: 1,
        sequence_parallel: false,
        run: RunOptions {
            steps: 2,
            recompute: recompute.parse()?,
            ..RunOptions::default()
        },
    };
    let mut last: Option<StepRecord> = None;
    train_gpt(&cfg, &Checked::new(generate(&spec))?, |s| {
        last = Some(s.clone())
    })?;
    let last = last.ok_or("no step ran")?;
    Ok(last.device_peaks(&mesh))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("memory.png"), PathBuf::from);
    let fmt = ImageFormat::from_path(&out)?;
    let none = peaks("none")?;
    let full = peaks("full")?;
    for (label, devices) in [("none", &none), ("full", &full)] {
        let totals: Vec<u64> = devices.iter().map(MemoryBreakdown::total).collect();
        let act: Vec<u64> = devices.iter().map(|m| m.activations).collect();
        println!("--recompute {label}: peak bytes per device {totals:?}, activations {act:?}");
    }
    let runs = [
        MemoryBars {
            label: "1f1b, p=4 m=8 (--recompute none)".into(),
            devices: &none,
        },
        MemoryBars {
            label: "1f1b, p=4 m=8, --recompute full".into(),
            devices: &full,
        },
    ];
    let opts = ChartOptions {
        width: 900,
        title: Some("measured peak memory per device: GPT 8 x 128, seq 64, b 4".into()),
        ..ChartOptions::default()
    };
    let bytes = memory_bars(&runs, &opts, fmt)?;
    // Written beside the target and renamed, so a reader never sees half a file.
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &out)?;
    println!("wrote {}", out.display());
    Ok(())
}
