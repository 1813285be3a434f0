//! Kernel benchmarks (CPU): matmul through the Tensor API against raw
//! `matrixmultiply::sgemm` on the same buffers, one training step of the
//! reference GPT with its tokens/s and the fraction of time in matmul, and the
//! step time of today's shapes (gated MLPs, RMSNorm, grouped-query attention)
//! against GPT-2's at equal parameters, and rotary positions against a learned table at
//! the same shape, as ratios measured in one run.
//!
//! Run: `cargo bench --bench kernels -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, Criterion, Throughput};
use pipewright_kernels::cpu::{self, gemm::matrixmultiply};
use pipewright_kernels::gpt::{
    BiasKind, GptConfig, GptStage, Microbatch, MlpKind, NormKind, Positions,
};
use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{NoTp, Parameters};
use pipewright_kernels::optim::{AdamW, AdamWConfig};
use pipewright_kernels::Tensor;
use std::hint::black_box;
use std::time::Instant;

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_f32");
    for n in [512usize, 1024] {
        let a = normal_tensor(&[n, n], 1.0, 1, "a");
        let b = normal_tensor(&[n, n], 1.0, 2, "b");
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        // The steady-state API (output buffer reused), then the allocating one.
        let mut c = Tensor::zeros(&[n, n]);
        g.bench_function(format!("tensor_api_into/{n}"), |bench| {
            bench.iter(|| {
                cpu::matmul_into(&a, &b, &mut c).unwrap();
                black_box(&c);
            })
        });
        g.bench_function(format!("tensor_api_alloc/{n}"), |bench| {
            bench.iter(|| black_box(cpu::matmul(&a, &b).unwrap()))
        });
        let mut out = vec![0.0f32; n * n];
        g.bench_function(format!("sgemm_direct/{n}"), |bench| {
            bench.iter(|| {
                // SAFETY: a, b and out are n*n row-major buffers.
                unsafe {
                    matrixmultiply::sgemm(
                        n,
                        n,
                        n,
                        1.0,
                        a.data().as_ptr(),
                        n as isize,
                        1,
                        b.data().as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        out.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                };
                black_box(&out);
            })
        });
    }
    g.finish();
}

/// The documented small size: vocab 256, seq 64, d_model 128, 4 heads,
/// 4 layers (d_ff 512), batch 8 sequences = 512 tokens per step (~0.9 M params).
fn small_gpt() -> (GptConfig, Vec<u32>, Vec<u32>, usize) {
    let cfg = GptConfig::new(256, 64, 128, 4, 4);
    let batch = 8;
    let tokens: Vec<u32> = (0..batch * 64).map(|i| (i * 31 % 256) as u32).collect();
    let targets = tokens.iter().map(|t| (t + 1) % 256).collect();
    (cfg, tokens, targets, batch)
}

fn train_step(m: &mut GptStage, opt: &mut AdamW, mb: &Microbatch<'_>) {
    m.zero_grad();
    let (_, stash) = m.forward(mb, None, &mut NoTp).unwrap();
    m.backward(stash, None, &mut NoTp).unwrap();
    opt.step(m).unwrap();
}

fn gpt_step(c: &mut Criterion) {
    let (cfg, tokens, targets, _) = small_gpt();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 64,
        loss_scale: 1.0,
    };
    let mut m = GptStage::whole(&cfg, 0).unwrap();
    let mut opt = AdamW::new(m.num_params(), AdamWConfig::default());
    let mut g = c.benchmark_group("gpt_train_step");
    g.sample_size(10);
    g.throughput(Throughput::Elements(tokens.len() as u64));
    g.bench_function("cpu_d128_l4_seq64_b8", |b| {
        b.iter(|| train_step(&mut m, &mut opt, &mb))
    });
    g.finish();
}

/// A separate, plain timing of a few steps with the matmul counters on, to
/// report tokens/s and the fraction of the step spent inside sgemm.
fn breakdown() {
    let (cfg, tokens, targets, _) = small_gpt();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 64,
        loss_scale: 1.0,
    };
    let mut m = GptStage::whole(&cfg, 0).unwrap();
    let mut opt = AdamW::new(m.num_params(), AdamWConfig::default());
    train_step(&mut m, &mut opt, &mb); // warm-up
    let steps = 5;
    cpu::reset_matmul_stats();
    let start = Instant::now();
    for _ in 0..steps {
        train_step(&mut m, &mut opt, &mb);
    }
    let total = start.elapsed().as_secs_f64();
    let s = cpu::matmul_stats();
    println!(
        "gpt_train_step breakdown ({} params): {:.0} tokens/s, {:.1} ms/step, matmul {:.1}% of time \
         ({} calls/step, {:.1} GFLOP/s in sgemm)",
        m.num_params(),
        (steps * tokens.len()) as f64 / total,
        total / steps as f64 * 1e3,
        100.0 * s.seconds / total,
        s.calls / steps as u64,
        s.flops as f64 / s.seconds / 1e9,
    );
}

/// The small GPT's shape and its variants at (nearly) its parameter count: a gated MLP
/// of two thirds the width (three matrices for two), and with grouped-query attention the
/// keys' and values' parameters moved into the MLP; then GPT-2's and Llama's (GQA) shapes
/// with rotary positions in place of the table (`_rope`, compared with their learned twins).
fn shapes() -> Vec<(&'static str, GptConfig)> {
    let (base, ..) = small_gpt();
    let gated = |mlp, d_ff, kv_heads| GptConfig {
        kv_heads,
        d_ff,
        mlp,
        norm: NormKind::RmsNorm,
        bias: BiasKind::None,
        ..base
    };
    let rope = |cfg: GptConfig| GptConfig {
        positions: Positions::ROTARY,
        ..cfg
    };
    vec![
        ("gelu_layernorm_mha", base),
        ("swiglu_rmsnorm_mha", gated(MlpKind::SwiGlu, 344, 4)),
        ("geglu_rmsnorm_mha", gated(MlpKind::GeGlu, 344, 4)),
        ("swiglu_rmsnorm_gqa2", gated(MlpKind::SwiGlu, 384, 2)),
        ("swiglu_rmsnorm_mqa", gated(MlpKind::SwiGlu, 408, 1)),
        ("gelu_layernorm_mha_rope", rope(base)),
        (
            "swiglu_rmsnorm_gqa2_rope",
            rope(gated(MlpKind::SwiGlu, 384, 2)),
        ),
    ]
}

fn gpt_shapes(c: &mut Criterion) {
    let (_, tokens, targets, _) = small_gpt();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 64,
        loss_scale: 1.0,
    };
    let mut g = c.benchmark_group("gpt_train_step_shapes");
    g.sample_size(10);
    g.throughput(Throughput::Elements(tokens.len() as u64));
    for (name, cfg) in shapes() {
        let mut m = GptStage::whole(&cfg, 0).unwrap();
        let mut opt = AdamW::new(m.num_params(), AdamWConfig::default());
        g.bench_function(name, |b| b.iter(|| train_step(&mut m, &mut opt, &mb)));
    }
    g.finish();
}

/// Each shape's step time over the baseline's, the shapes taking turns (10 rounds of 3 steps
/// each, median per shape), so the machine's load moves them alike.
fn shape_ratios() {
    let (_, tokens, targets, _) = small_gpt();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 64,
        loss_scale: 1.0,
    };
    let mut models: Vec<_> = shapes()
        .into_iter()
        .map(|(name, cfg)| {
            let m = GptStage::whole(&cfg, 0).unwrap();
            let opt = AdamW::new(m.num_params(), AdamWConfig::default());
            (name, m, opt, Vec::new())
        })
        .collect();
    for round in 0..11 {
        for (_, m, opt, times) in &mut models {
            let start = Instant::now();
            for _ in 0..3 {
                train_step(m, opt, &mb);
            }
            if round > 0 {
                times.push(start.elapsed().as_secs_f64() / 3.0);
            }
        }
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let base = median(&mut models[0].3);
    let mut steps = Vec::new();
    for (name, m, _, times) in &mut models {
        let t = median(times);
        steps.push((*name, t));
        println!(
            "gpt shape {name}: {} params, {:.1} ms/step, {:.3}x the GeLU/LayerNorm step",
            m.num_params(),
            t * 1e3,
            t / base
        );
    }
    let step = |name: &str| steps.iter().find(|s| s.0 == name).map(|s| s.1);
    for (name, t) in &steps {
        if let Some(learned) = name.strip_suffix("_rope").and_then(step) {
            println!(
                "gpt shape {name}: {:.3}x the same shape with a learned table",
                t / learned
            );
        }
    }
}

criterion_group!(benches, matmul, gpt_step, gpt_shapes);

fn main() {
    benches();
    breakdown();
    shape_ratios();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
