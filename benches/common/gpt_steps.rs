//! The pipeline speed-up workload shared by the `runtime` and `speedup` benches: the reference
//! GPT at a compute-bound size (4 layers, d=256, seq 64), m=8 microbatches of 4 sequences.

use std::time::Duration;

use pipewright::kernels::gpt::GptConfig;
use pipewright::runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
use pipewright::schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

/// `kind` on `p` devices with `v` chunks each, over the workload's m=8 microbatches.
pub fn gpt_timetable(kind: ScheduleKind, p: u32, v: u32) -> Checked {
    let tt = generate(&ScheduleSpec::new(kind, p, v, 8, None).expect("spec"));
    Checked::new(tt).expect("a generated timetable is valid")
}

/// Summed step time of `steps` training steps of `tt`, skipping the first `warmup` steps
/// (their first-touch page faults are not the runtime's steady state).
pub fn gpt_steps(tt: &Checked, warmup: u64, steps: u64) -> Duration {
    let cfg = TrainConfig {
        mesh: Mesh::new(tt.num_devices() as usize, 1, 1).expect("mesh"),
        model: GptConfig::new(64, 64, 256, 4, 4),
        microbatch_size: 4,
        sequence_parallel: false,
        seed: 0,
        run: RunOptions {
            steps: warmup + steps,
            ..RunOptions::default()
        },
    };
    let mut total = 0.0;
    let mut seen = 0;
    train_gpt(&cfg, tt, |s| {
        if seen >= warmup {
            total += s.seconds;
        }
        seen += 1;
    })
    .expect("trains");
    Duration::from_secs_f64(total)
}
