//! The pipeline speed-up workload shared by the `runtime` and `speedup` benches: the reference
//! GPT at a compute-bound size (4 layers, d=256, seq 64), 1F1B over m=8 microbatches of 4
//! sequences.

use std::time::Duration;

use pipewright::kernels::gpt::GptConfig;
use pipewright::runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
use pipewright::schedule::{generate, ScheduleKind, ScheduleSpec};

/// Summed step time of `steps` training steps on `pp` devices, skipping the first
/// `warmup` steps (their first-touch page faults are not the runtime's steady state).
pub fn gpt_steps(pp: usize, warmup: u64, steps: u64) -> Duration {
    let cfg = TrainConfig {
        mesh: Mesh::new(pp, 1, 1).expect("mesh"),
        model: GptConfig::new(64, 64, 256, 4, 4),
        microbatch_size: 4,
        seed: 0,
        run: RunOptions {
            steps: warmup + steps,
            ..RunOptions::default()
        },
    };
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, pp as u32, 1, 8, None).expect("spec");
    let mut total = 0.0;
    let mut seen = 0;
    train_gpt(&cfg, &generate(&spec), |s| {
        if seen >= warmup {
            total += s.seconds;
        }
        seen += 1;
    })
    .expect("trains");
    Duration::from_secs_f64(total)
}
