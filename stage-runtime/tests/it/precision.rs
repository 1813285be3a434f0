//! Mixed precision on the CPU, where the host backend emulates the GPU's formats (bf16 or
//! TF32 matmul inputs, f32 accumulation; bf16 residual stream and hand-offs; f32 master
//! weights, gradients and AdamW moments).
//!
//! Tolerances, from what rounding can do (and what was measured when they were set):
//! - bf16 against f32: bf16 keeps 8 significant bits (unit roundoff 2^-9, 0.2%). The first
//!   loss (a forward only) differs by 1.5e-5 relative (2e-5 before stashes were kept in
//!   bf16); later steps train on slightly different weights and drift (0.5% by step 8 of this
//!   model, 0.2% before bf16 stashes: step 8 moves by tenths of a percent with any bf16 detail;
//!   3% by step 30, where the two runs are different trajectories of one descent). Over 8
//!   steps: within 1%, and the loss falls.
//! - TF32 against f32: 11 significant bits, a quarter of bf16's error: within 0.25%.
//! - a pipeline against one device in the same precision: pipelining changes no sum's order,
//!   so the bits are equal. TP and DP do change the order of f32 sums (partial products, the
//!   gradient all-reduce); a difference of an f32 ulp can flip an element's bf16 rounding by a
//!   bf16 ulp (2^-8), so bf16 with TP and DP is near-exact: within 1e-3 relative over 8 steps
//!   (5.4e-5 measured; 2.4e-4 before stashes were kept in bf16), where f32 agrees to 1e-6.

use pipewright_kernels::gpt::GptConfig;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Precision;
use pipewright_runtime::{train_gpt, FinalParams, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, Timetable};

fn config(mesh: Mesh, precision: Precision, steps: u64) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(32, 16, 32, 4, 4),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 5,
        run: RunOptions {
            steps,
            adamw: AdamWConfig {
                lr: 1e-2,
                eps: 1e-3,
                ..AdamWConfig::default()
            },
            precision,
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, p, v, m, None).expect("spec"))
}

fn train(cfg: &TrainConfig, tt: &Timetable) -> (Vec<f32>, FinalParams) {
    let mut losses = Vec::new();
    let params = train_gpt(cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.expect("loss"))
    })
    .expect("run");
    (losses, params)
}

const STEPS: u64 = 8;

fn losses(mesh: Mesh, precision: Precision, tt: &Timetable) -> Vec<f32> {
    train(&config(mesh, precision, STEPS), tt).0
}

fn worst_relative(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn bf16_and_tf32_train_close_to_f32_and_bf16_falls() {
    let one = Mesh::new(1, 1, 1).unwrap();
    let tt = timetable(ScheduleKind::OneFOneB, 1, 1, 4);
    let f32_run = losses(one, Precision::F32, &tt);
    let bf16 = losses(one, Precision::Bf16, &tt);
    let tf32 = losses(one, Precision::Tf32, &tt);
    println!("f32  {f32_run:?}\nbf16 {bf16:?}\ntf32 {tf32:?}");
    // The precisions really differ (a bf16 run that silently ran in f32 would pass the rest).
    assert_ne!(bf16, f32_run);
    assert_ne!(tf32, f32_run);
    assert!(
        worst_relative(&f32_run, &bf16) <= 1e-2,
        "bf16 drifts from f32"
    );
    assert!(
        worst_relative(&f32_run, &tf32) <= 2.5e-3,
        "tf32 drifts from f32"
    );
    // Each step draws a new batch, so single steps are noisy; over 8 the reference falls
    // by 10% (3.47 to 3.13), and bf16 must too.
    assert!(
        f32_run[7] < 0.95 * f32_run[0],
        "the f32 reference falls: {f32_run:?}"
    );
    assert!(bf16[7] < 0.95 * bf16[0], "bf16 falls: {bf16:?}");
}

#[test]
fn a_bf16_pipeline_equals_one_bf16_device_to_the_bit() {
    let one = losses(
        Mesh::new(1, 1, 1).unwrap(),
        Precision::Bf16,
        &timetable(ScheduleKind::OneFOneB, 1, 1, 4),
    );
    for (kind, v) in [
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
    ] {
        let pp2 = losses(
            Mesh::new(2, 1, 1).unwrap(),
            Precision::Bf16,
            &timetable(kind, 2, v, 4),
        );
        assert_eq!(pp2, one, "{kind:?}");
    }
}

#[test]
fn bf16_pp2_tp2_dp2_is_near_one_bf16_device() {
    // dp = 2 doubles the global batch: one device runs both replicas' 2 x 4 microbatches.
    let one = Mesh::new(1, 1, 1).unwrap();
    let single = losses(
        one,
        Precision::Bf16,
        &timetable(ScheduleKind::OneFOneB, 1, 1, 8),
    );
    let mesh = Mesh::new(2, 2, 2).unwrap();
    let tt = timetable(ScheduleKind::Interleaved1F1B, 2, 2, 4);
    let meshed = losses(mesh, Precision::Bf16, &tt);
    println!("one device {single:?}\npp2 tp2 dp2 {meshed:?}");
    assert!(worst_relative(&single, &meshed) <= 1e-3);
    // The same comparison in f32 is within f32 rounding: the bf16 gap is bf16's own.
    let single32 = losses(
        one,
        Precision::F32,
        &timetable(ScheduleKind::OneFOneB, 1, 1, 8),
    );
    assert!(worst_relative(&single32, &losses(mesh, Precision::F32, &tt)) <= 1e-6);
}

/// What one microbatch's forward keeps on each stage of `cfg`'s model cut in two halves
/// (`b` sequences), as (tensor elements, 4-byte elements), from the layers' definitions: per
/// block both norms' `x̂` (tensors) and `1/σ` (4 bytes), attention's input, `qkv` and
/// context (tensors) and its CPU probabilities (4 bytes: a GPU recomputes them in f32), and
/// the MLP's input, pre-activation and activation (tensors); the first stage's token ids;
/// the last stage's head: its norm's `x̂` and `1/σ`, normed input, and the loss's softmax
/// probabilities and targets (4 bytes in every precision).
fn kept_elements(cfg: &GptConfig, b: usize) -> [(usize, usize); 2] {
    let (n, d, f, s, v) = (
        b * cfg.seq_len,
        cfg.d_model,
        cfg.d_ff,
        cfg.seq_len,
        cfg.vocab,
    );
    let block_tensors = 2 * n * d + (n * d + 3 * n * d + n * d) + (n * d + 2 * n * f);
    let block_rows = 2 * n + b * cfg.n_heads * s * s;
    let blocks = cfg.n_layers / 2;
    let (tensors, rows) = (blocks * block_tensors, blocks * block_rows);
    [
        (tensors, rows + n),
        (tensors + 2 * n * d, rows + n + n * v + n),
    ]
}

/// The runtime's memory record of a bf16 run: a stash's tensors take 2 bytes an element,
/// half of an f32 (or tf32) run's, and its row statistics, ids and probabilities the same 4
/// bytes.
#[test]
fn a_bf16_stash_holds_half_the_f32_tensor_bytes_and_the_same_row_statistics() {
    let tt = timetable(ScheduleKind::OneFOneB, 2, 1, 2);
    let kept = |p| {
        let cfg = config(Mesh::new(2, 1, 1).unwrap(), p, 1);
        let mut kept = None;
        train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            kept = Some(s.kept_per_microbatch.clone())
        })
        .expect("run");
        (
            kept.expect("one step"),
            kept_elements(&cfg.model, cfg.microbatch_size),
        )
    };
    for p in [Precision::F32, Precision::Tf32] {
        let (got, want) = kept(p);
        assert_eq!(got, want.map(|(t, r)| 4 * (t + r) as u64), "{p}");
    }
    let (got, want) = kept(Precision::Bf16);
    assert_eq!(got, want.map(|(t, r)| (2 * t + 4 * r) as u64), "bf16");
    println!("kept per microbatch, bf16: {got:?}");
}
