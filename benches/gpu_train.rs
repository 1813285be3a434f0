//! Training steps of the 118M-parameter GPT of issue 12 on `cuda:0`, one benchmark per
//! precision (f32, tf32, bf16): 8 layers, d_model 1024, 16 heads, seq 256, vocab 8192; a step
//! is 8 microbatches of 8 sequences (16,384 tokens) accumulated on one device, then AdamW.
//! `scripts/torch_gpt_bench.py` runs the same model and step in PyTorch (see BENCHMARKS.md).
//!
//! A step's time is the wall time between the ends of consecutive steps, after a warm-up
//! step: the GPU's queue is never drained between them, as in a real run. Without the `cuda`
//! feature, or without CUDA on the machine, it prints `skipped: <why>` and exits 0.
//!
//! `cargo bench --features cuda --bench gpu_train` (a filter such as `-- bf16` runs one).

#[cfg(not(feature = "cuda"))]
fn main() {
    println!(
        "skipped: built without the cuda feature (run: cargo bench --features cuda --bench gpu_train)"
    );
}

#[cfg(feature = "cuda")]
fn main() {
    use pipewright::kernels::cuda::CudaBackend;
    use pipewright::kernels::KernelError;

    match CudaBackend::new(0) {
        Ok(gpu) => drop(gpu),
        Err(e @ KernelError::CudaUnavailable(_)) => {
            println!("skipped: {e}");
            return;
        }
        Err(e) => panic!("CUDA is present but its backend failed: {e}"),
    }
    let mut c = criterion::Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(30))
        .configure_from_args();
    gpu::bench(&mut c);
    c.final_summary();
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::{Duration, Instant};

    use criterion::{Criterion, SamplingMode};
    use pipewright::kernels::gpt::GptConfig;
    use pipewright::kernels::Precision;
    use pipewright::runtime::{train_gpt_cuda, Mesh, RunOptions, TrainConfig};
    use pipewright::schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

    /// Microbatches accumulated per step.
    const M: u32 = 8;

    fn config(precision: Precision, steps: u64) -> TrainConfig {
        TrainConfig {
            mesh: Mesh::new(1, 1, 1).expect("mesh"),
            // vocab, seq, d_model, heads, layers
            model: GptConfig::new(8192, 256, 1024, 16, 8),
            microbatch_size: 8,
            sequence_parallel: false,
            seed: 0,
            run: RunOptions {
                steps,
                precision,
                ..RunOptions::default()
            },
        }
    }

    /// Total time of `steps` steps after one warm-up step (the model is built and uploaded
    /// before the clock starts).
    fn time_steps(precision: Precision, steps: u64) -> Duration {
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, M, None).expect("spec"));
        let tt = Checked::new(tt).expect("a generated timetable is valid");
        let mut ends = Vec::new();
        train_gpt_cuda(&config(precision, steps + 1), &tt, 0, |_| {
            ends.push(Instant::now())
        })
        .expect("trains on cuda:0");
        ends[ends.len() - 1] - ends[0]
    }

    pub fn bench(c: &mut Criterion) {
        let mut g = c.benchmark_group("gpt118m_step_cuda0");
        g.sampling_mode(SamplingMode::Flat);
        for p in Precision::ALL {
            g.bench_function(p.name(), |b| {
                b.iter_custom(|iters| time_steps(p, iters.max(1)))
            });
        }
        g.finish();
    }
}
