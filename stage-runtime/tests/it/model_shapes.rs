//! The reference GPT in today's shapes (grouped-query attention, a gated MLP, RMSNorm, rotary
//! positions) trains like the GPT-2-shaped one: PP x TP x DP equals one device under
//! interleaved 1F1B, ZB-H1 and ZBV; sequence parallelism equals TP without it; every
//! recomputation policy is bit-identical; bf16 stays close to f32.

use crate::whole;
use pipewright_schedule::Checked;

use pipewright_kernels::gpt::{BiasKind, GptConfig, MlpKind, NormKind, Positions};
use pipewright_kernels::Precision;
use pipewright_runtime::{train_gpt, FinalParams, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, Timetable};
use whole::{check_params, close, single_device};

const STEPS: u64 = 3;
const M: u32 = 4;

/// Llama's shape, small: 4 query heads reading 2 key/value heads, SwiGLU of width 40, RMSNorm,
/// no biases, rotary positions (base 100, so both pairs of a 4-wide head turn visibly over
/// 8 positions).
fn llama() -> GptConfig {
    GptConfig {
        kv_heads: 2,
        d_ff: 40,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        bias: BiasKind::None,
        positions: Positions::Rotary { theta: 100.0 },
        ..GptConfig::new(16, 8, 16, 4, 8)
    }
}

/// Multi-query attention with a GeGLU MLP, LayerNorm, a QKV bias only (Qwen2's biases) and a
/// learned position table.
fn mqa_geglu() -> GptConfig {
    GptConfig {
        kv_heads: 1,
        mlp: MlpKind::GeGlu,
        norm: NormKind::LayerNorm,
        bias: BiasKind::Qkv,
        positions: Positions::Learned,
        ..llama()
    }
}

fn config(model: GptConfig, mesh: Mesh) -> TrainConfig {
    TrainConfig {
        mesh,
        model,
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 11,
        run: RunOptions {
            steps: STEPS,
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, pp: usize, v: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, pp as u32, v, M, None).unwrap())
}

struct Trained {
    losses: Vec<f32>,
    params: FinalParams,
    stash_bytes: Vec<u64>,
}

fn train(cfg: &TrainConfig, tt: &Timetable) -> Trained {
    let (mut losses, mut stash_bytes) = (Vec::new(), Vec::new());
    let params = train_gpt(cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.unwrap());
        stash_bytes = s.peak_stash_bytes.clone();
    })
    .unwrap_or_else(|e| panic!("{}: {e}", tt.name));
    Trained {
        losses,
        params,
        stash_bytes,
    }
}

fn bits(p: &FinalParams) -> Vec<Vec<u32>> {
    p.values()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn pp_tp_dp_equals_one_device_under_interleaved_zb_h1_and_zbv() {
    let families = [
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Zbv, 2),
    ];
    let cases = [
        (llama(), (2, 2, 2)),
        (llama(), (4, 1, 1)),
        (mqa_geglu(), (2, 1, 2)),
    ];
    for (model, (pp, tp, dp)) in cases {
        for (kind, v) in families {
            let cfg = config(model, Mesh::new(pp, tp, dp).unwrap());
            let tt = timetable(kind, pp, v);
            let what = format!("{} kv={} tp={tp} dp={dp}", tt.name, model.kv_heads);
            let got = train(&cfg, &tt);
            let (want, whole) = single_device(&cfg, M, STEPS);
            assert_eq!(got.losses.len(), want.len());
            for (step, (a, b)) in got.losses.iter().zip(&want).enumerate() {
                assert!(close(*a, *b), "{what}: step {step} loss {a} vs {b}");
            }
            assert!(want[STEPS as usize - 1] < want[0], "it trains: {want:?}");
            check_params(&cfg, tt.num_stages() as usize, &got.params, &whole, &what);
        }
    }
}

#[test]
fn sequence_parallelism_trains_as_tensor_parallelism() {
    for (kind, v, recompute) in [
        (ScheduleKind::OneFOneB, 1, "none"),
        (ScheduleKind::ZbH1, 1, "selective"),
        (ScheduleKind::Interleaved1F1B, 2, "full"),
    ] {
        let mut cfg = config(llama(), Mesh::new(2, 2, 1).unwrap());
        cfg.run.recompute = recompute.parse().unwrap();
        let tt = timetable(kind, 2, v);
        let want = train(&cfg, &tt);
        cfg.sequence_parallel = true;
        let got = train(&cfg, &tt);
        let what = format!("{} {recompute}", tt.name);
        for (a, b) in want.losses.iter().zip(&got.losses) {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "{what}: loss {b} vs {a}");
        }
        for (key, w) in &want.params {
            let worst = w
                .iter()
                .zip(&got.params[key])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst <= 1e-5, "{what}: {key:?} differs by {worst}");
        }
        let (a, b) = (&want.stash_bytes, &got.stash_bytes);
        assert!(
            a.iter().zip(b).all(|(a, b)| b < a),
            "{what}: {b:?} vs {a:?}"
        );
    }
}

#[test]
fn every_recomputation_policy_is_bit_identical() {
    for (kind, v, mesh) in [
        (ScheduleKind::Interleaved1F1B, 2, (2, 1, 1)),
        (ScheduleKind::Zbv, 2, (2, 2, 1)),
    ] {
        let tt = timetable(kind, mesh.0, v);
        for model in [llama(), mqa_geglu()] {
            let mesh = Mesh::new(mesh.0, mesh.1.min(model.kv_heads), mesh.2).unwrap();
            let base = train(&config(model, mesh), &tt);
            for plan in ["full", "selective", "every:1"] {
                let mut cfg = config(model, mesh);
                cfg.run.recompute = plan.parse().unwrap();
                let got = train(&cfg, &tt);
                let what = format!("{} kv={} {plan}", tt.name, model.kv_heads);
                let bits32 = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits32(&got.losses), bits32(&base.losses), "{what}");
                assert_eq!(bits(&got.params), bits(&base.params), "{what}");
                assert!(got.stash_bytes[0] < base.stash_bytes[0], "{what}");
            }
        }
    }
}

/// Tolerances as `precision.rs` sets them for the GPT-2 shape: bf16 within 1% of f32 over 8
/// steps (and falling); a pipeline with TP and DP within 1e-3 of one device in bf16.
#[test]
fn bf16_trains_close_to_f32() {
    let steps = 8;
    let one = Mesh::new(1, 1, 1).unwrap();
    let run = |mesh: Mesh, precision: Precision, tt: &Timetable| {
        let mut cfg = config(llama(), mesh);
        cfg.run.steps = steps;
        cfg.run.precision = precision;
        train(&cfg, tt).losses
    };
    let tt1 = timetable(ScheduleKind::OneFOneB, 1, 1);
    let f32_run = run(one, Precision::F32, &tt1);
    let bf16 = run(one, Precision::Bf16, &tt1);
    assert_ne!(bf16, f32_run, "bf16 really rounds");
    let rel = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
            .fold(0.0, f32::max)
    };
    assert!(rel(&f32_run, &bf16) <= 1e-2, "{f32_run:?} vs {bf16:?}");
    assert!(bf16[steps as usize - 1] < bf16[0], "bf16 trains: {bf16:?}");
    let tt = timetable(ScheduleKind::ZbH1, 2, 1);
    let mesh = run(Mesh::new(2, 2, 2).unwrap(), Precision::Bf16, &tt);
    // The mesh's global batch is dp times one device's: compare with one device on it.
    let mut cfg = config(llama(), Mesh::new(1, 1, 2).unwrap());
    cfg.run.steps = steps;
    cfg.run.precision = Precision::Bf16;
    let dp_only = train(&cfg, &timetable(ScheduleKind::OneFOneB, 1, 1)).losses;
    assert!(rel(&dp_only, &mesh) <= 1e-3, "{dp_only:?} vs {mesh:?}");
}
