//! The memory model's prediction against the runtime's measurement: the reference GPT trained
//! on the CPU over a grid that takes every value of every dimension at least once (pp 1/2/4,
//! tp 1/2, dp 1/2, v 1/2; 1F1B, interleaved 1F1B, ZB-H1, ZBV; recompute none, selective,
//! full, every:N and per stage, with and without explicit R actions; ZeRO 0/1; sequence
//! parallelism off and on, with recomputation and with ZeRO-1; f32 and bf16), and a second
//! grid of today's shapes (grouped-query attention with SwiGLU, RMSNorm and rotary positions,
//! no biases;
//! multi-query attention with GeGLU, a QKV bias only; SwiGLU with LayerNorm) over the same
//! kinds of points. On every rank the predicted peak (the moment of the highest total, in a
//! step after the first, when AdamW's state exists) is within 5% of the measured one, and on
//! the device's largest rank every category of it is equal to the byte.

use pipewright_kernels::gpt::{GptConfig, GptStage};
use pipewright_kernels::layers::{Parameters, TpShard};
use pipewright_kernels::Precision;
use pipewright_model::memory::{
    predict, predict_detail, stage_parameters, Accounting, DevicePrediction, MemPrecision,
    MemoryBreakdown, MemoryConfig, ModelShape,
};
use pipewright_model::shape::{BiasKind, MlpKind, NormKind, PositionKind};
use pipewright_runtime::{gpt_config, train_gpt, Mesh, RunOptions, StepRecord, TrainConfig, Zero};
use pipewright_schedule::recompute::insert;
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec};

/// One grid point.
struct Point {
    kind: ScheduleKind,
    pp: u32,
    v: u32,
    tp: u32,
    dp: u32,
    plan: &'static str,
    zero: u8,
    /// Explicit `R` actions in the timetable.
    with_r: bool,
    bf16: bool,
    sp: bool,
}

const fn pt(
    kind: ScheduleKind,
    (pp, v, tp, dp): (u32, u32, u32, u32),
    plan: &'static str,
    zero: u8,
    (with_r, bf16, sp): (bool, bool, bool),
) -> Point {
    Point {
        kind,
        pp,
        v,
        tp,
        dp,
        plan,
        zero,
        with_r,
        bf16,
        sp,
    }
}

const NO: (bool, bool, bool) = (false, false, false);
const R: (bool, bool, bool) = (true, false, false);
const SP: (bool, bool, bool) = (false, false, true);

const GRID: [Point; 19] = {
    use ScheduleKind::*;
    [
        pt(OneFOneB, (1, 1, 1, 1), "none", 0, NO),
        pt(OneFOneB, (2, 1, 2, 1), "selective", 0, NO),
        pt(OneFOneB, (4, 1, 1, 2), "full", 1, R),
        pt(OneFOneB, (2, 1, 1, 1), "every:1", 0, (false, true, false)),
        pt(Interleaved1F1B, (2, 2, 1, 2), "selective", 1, R),
        pt(
            Interleaved1F1B,
            (4, 2, 2, 1),
            "none",
            0,
            (false, true, false),
        ),
        pt(
            Interleaved1F1B,
            (2, 2, 1, 1),
            "0:full,1:selective,3:every:2",
            0,
            NO,
        ),
        pt(ZbH1, (2, 1, 2, 2), "full", 1, NO),
        pt(ZbH1, (4, 1, 1, 1), "selective", 0, R),
        pt(Zbv, (2, 2, 1, 1), "full", 0, R),
        pt(Zbv, (4, 2, 2, 2), "none", 1, NO),
        pt(Zbv, (2, 2, 2, 1), "every:1", 0, NO),
        // Sequence parallelism: alone, with each recompute policy, with ZeRO-1, split backward.
        pt(OneFOneB, (2, 1, 2, 1), "none", 0, SP),
        pt(OneFOneB, (4, 1, 2, 2), "full", 1, (true, false, true)),
        pt(Interleaved1F1B, (2, 2, 2, 2), "selective", 1, SP),
        pt(ZbH1, (2, 1, 2, 1), "every:1", 0, SP),
        pt(Zbv, (2, 2, 2, 2), "full", 1, SP),
        // bf16 stashes with a split backward (weight stashes held from I to W) and SP.
        pt(ZbH1, (2, 1, 2, 1), "every:1", 0, (false, true, true)),
        // bf16 under selective recomputation (the probabilities dropped are 4-byte ones).
        pt(Zbv, (2, 2, 1, 1), "selective", 0, (false, true, false)),
    ]
};

const M: u32 = 4;

/// The grid's GPT: vocab 16, seq 8, d_model 16, 2 heads, 8 layers, d_ff 64.
fn shape() -> ModelShape {
    ModelShape::gpt(8, 16, 2, 64, 8, 16)
}

/// Today's shapes at the grid's size, 4 heads of width 4: Llama's (2 key/value heads, SwiGLU
/// of width 40, RMSNorm, rotary positions of Llama 3's base, no biases), multi-query
/// attention with GeGLU and a QKV bias only, and SwiGLU with LayerNorm and every bias.
fn new_shapes() -> [ModelShape; 3] {
    let base = ModelShape::gpt(8, 16, 4, 40, 8, 16);
    [
        ModelShape {
            kv_heads: 2,
            mlp: MlpKind::SwiGlu,
            norm: NormKind::RmsNorm,
            positions: PositionKind::Rotary,
            rope_theta: "500000".parse().unwrap(),
            bias: BiasKind::None,
            ..base
        },
        ModelShape {
            kv_heads: 1,
            mlp: MlpKind::GeGlu,
            bias: BiasKind::Qkv,
            ..base
        },
        ModelShape {
            mlp: MlpKind::SwiGlu,
            ..base
        },
    ]
}

/// Points of the second grid: (index into [`new_shapes`], point). Multi-query attention has
/// one key/value head, so it takes no TP (the TP size must divide the key/value heads).
const SHAPE_GRID: [(usize, Point); 12] = {
    use ScheduleKind::*;
    [
        (0, pt(OneFOneB, (2, 1, 2, 1), "none", 0, NO)),
        (0, pt(Interleaved1F1B, (2, 2, 2, 2), "selective", 1, R)),
        (0, pt(ZbH1, (2, 1, 2, 1), "every:1", 0, SP)),
        (0, pt(Zbv, (2, 2, 2, 1), "full", 0, (false, true, true))),
        (
            0,
            pt(Zbv, (2, 2, 1, 2), "selective", 1, (false, true, false)),
        ),
        (1, pt(OneFOneB, (4, 1, 1, 2), "full", 1, R)),
        (
            1,
            pt(ZbH1, (2, 1, 1, 1), "selective", 0, (false, true, false)),
        ),
        (1, pt(Zbv, (2, 2, 1, 1), "none", 0, NO)),
        (
            1,
            pt(
                Interleaved1F1B,
                (2, 2, 1, 1),
                "0:full,1:selective,3:every:2",
                0,
                NO,
            ),
        ),
        (2, pt(ZbH1, (2, 1, 2, 2), "none", 1, NO)),
        (2, pt(OneFOneB, (2, 1, 2, 1), "every:1", 0, SP)),
        (
            2,
            pt(Interleaved1F1B, (2, 2, 2, 1), "full", 0, (true, true, true)),
        ),
    ]
};

/// Train two steps of `p` (3 sequences a microbatch) in `shape` and predict it: the second
/// step's record and the prediction per device.
fn run_shape(p: &Point, shape: &ModelShape) -> (StepRecord, Vec<DevicePrediction>) {
    let plan: RecomputePlan = p.plan.parse().unwrap();
    let mut tt = generate(&ScheduleSpec::new(p.kind, p.pp, p.v, M, None).unwrap());
    if p.with_r {
        tt = insert(&tt, &plan);
    }
    let cfg = TrainConfig {
        mesh: Mesh::new(p.pp as usize, p.tp as usize, p.dp as usize).unwrap(),
        model: gpt_config(shape).unwrap(),
        microbatch_size: 3,
        seed: 1,
        sequence_parallel: p.sp,
        run: RunOptions {
            steps: 2,
            recompute: plan.clone(),
            zero: Zero::from_level(u32::from(p.zero), p.pp as usize).unwrap(),
            precision: if p.bf16 {
                Precision::Bf16
            } else {
                Precision::F32
            },
            ..RunOptions::default()
        },
    };
    let mut measured = None;
    train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        measured = Some(s.clone())
    })
    .unwrap();
    let measured = measured.unwrap();
    assert_eq!(measured.step, 1);
    let mem = MemoryConfig {
        precision: if p.bf16 {
            MemPrecision::Bf16
        } else {
            MemPrecision::F32
        },
        tp: p.tp,
        dp: p.dp,
        v: p.v,
        microbatch_size: 3,
        zero: p.zero,
        sequence_parallel: p.sp,
        recompute: plan,
        ..MemoryConfig::new(*shape, p.pp).with_accounting(Accounting::Pipewright)
    };
    (measured, predict_detail(&mem, &tt).unwrap())
}

/// `|measured - predicted| <= 5%` of the measured total.
fn within_5_percent(measured: &MemoryBreakdown, predicted: &MemoryBreakdown) -> bool {
    let (m, p) = (measured.total() as f64, predicted.total() as f64);
    (m - p).abs() <= 0.05 * m
}

#[test]
fn predicted_peaks_equal_the_measured_ones_on_every_rank_of_the_grid() {
    for p in &GRID {
        check_point(p, &shape());
    }
}

#[test]
fn predicted_peaks_equal_the_measured_ones_in_today_s_shapes() {
    let shapes = new_shapes();
    for (i, p) in &SHAPE_GRID {
        check_point(p, &shapes[*i]);
    }
}

/// The measured peaks of `p` trained in `shape` against the prediction: within 5% on every
/// rank, equal to the byte on each device's largest.
fn check_point(p: &Point, shape: &ModelShape) {
    {
        let at = format!(
            "{:?} pp={} v={} tp={} dp={} {} zero={} R={} sp={} bf16={} kv={} {} {} {} bias {}",
            p.kind,
            p.pp,
            p.v,
            p.tp,
            p.dp,
            p.plan,
            p.zero,
            p.with_r,
            p.sp,
            p.bf16,
            shape.kv_heads,
            shape.mlp,
            shape.norm,
            shape.positions,
            shape.bias
        );
        let (measured, predicted) = run_shape(p, shape);
        let per_device = (p.tp * p.dp) as usize;
        let stashes: Vec<u64> = predicted.iter().map(|d| d.max.activations).collect();
        assert!(stashes.iter().all(|&b| b > 0), "{at}: {stashes:?}");
        assert_eq!(stashes, measured.peak_stash_bytes, "{at}: stashes");
        for (d, ranks) in measured.memory.chunks(per_device).enumerate() {
            let want = &predicted[d];
            for (r, m) in ranks.iter().enumerate() {
                let at = format!("{at}: device {d} rank {r}");
                assert!(
                    within_5_percent(&m.peak, &want.peak),
                    "{at}: {m:?} {want:?}"
                );
                assert_eq!(
                    (m.peak.parameters, m.peak.gradients, m.peak.workspace),
                    (want.peak.parameters, want.peak.gradients, 0),
                    "{at}"
                );
                assert!(m.peak.optimizer_state <= want.peak.optimizer_state, "{at}");
                assert_eq!(m.max.activations, want.max.activations, "{at}");
                assert!(m.max.buffers <= want.max.buffers, "{at}: {m:?} {want:?}");
            }
            // The largest rank (the first of the DP group: ZeRO-1 shards round up there)
            // holds the prediction to the byte.
            let largest = ranks.iter().max_by_key(|m| m.peak.total()).unwrap();
            assert_eq!(largest.peak, want.peak, "{at}: device {d} peak");
            assert_eq!(largest.max.buffers, want.max.buffers, "{at}: device {d}");
        }
        assert_eq!(
            measured.device_peaks(&Mesh::new(p.pp as usize, p.tp as usize, p.dp as usize).unwrap()),
            predicted.iter().map(|d| d.peak).collect::<Vec<_>>(),
            "{at}: device peaks"
        );
    }
}

#[test]
fn predicted_parameters_and_gradients_are_each_rank_s_tensors() {
    // d_ff 48 (not 4 * d_model) and 5 layers over 2 and 4 stages: uneven cuts.
    let model = GptConfig {
        d_ff: 48,
        ..GptConfig::new(11, 6, 16, 4, 5)
    };
    let shape = ModelShape::gpt(5, 16, 4, 48, 6, 11);
    let whole: u64 = (0..3).map(|s| stage_parameters(&shape, 3, s)).sum();
    assert_eq!(whole, model.num_params() as u64);
    for (pp, tp) in [(1u32, 1u32), (2, 2), (4, 4), (4, 2)] {
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, pp, 1, 4, None).unwrap());
        let mem = MemoryConfig {
            tp,
            ..MemoryConfig::new(shape, pp).with_accounting(Accounting::Pipewright)
        };
        let predicted = predict(&mem, &tt).unwrap();
        for s in 0..pp {
            assert_eq!(stage_parameters(&shape, pp, s), {
                let st = GptStage::new(&model, 0, s as usize, pp as usize, TpShard::SINGLE);
                st.unwrap().num_params() as u64
            });
            for rank in 0..tp as usize {
                let shard = TpShard::new(rank, tp as usize).unwrap();
                let st = GptStage::new(&model, 0, s as usize, pp as usize, shard).unwrap();
                let bytes = 4 * st.num_params() as u64;
                let m = predicted[s as usize];
                assert_eq!(
                    (m.parameters, m.gradients),
                    (bytes, bytes),
                    "pp {pp} tp {tp}"
                );
            }
        }
    }
}
