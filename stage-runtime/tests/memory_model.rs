//! The memory model's prediction against the runtime's measurement: the reference GPT trained
//! on the CPU over a grid that takes every value of every dimension at least once (pp 1/2/4,
//! tp 1/2, dp 1/2, v 1/2; 1F1B, interleaved 1F1B, ZB-H1, ZBV; recompute none, selective,
//! full, every:N and per stage, with and without explicit R actions; ZeRO 0/1; f32 and bf16).
//! Stashed activations per pipeline device and optimizer state per rank must be equal to
//! the byte.

use pipewright_kernels::gpt::{GptConfig, GptStage};
use pipewright_kernels::layers::{Parameters, TpShard};
use pipewright_kernels::Precision;
use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig, Zero};
use pipewright_schedule::memory::{
    predict, stage_parameters, Accounting, MemPrecision, MemoryConfig, ModelShape,
};
use pipewright_schedule::recompute::insert;
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec};

/// One grid point: schedule, pp, v, tp, dp, recompute plan, ZeRO level, explicit `R`s, bf16.
type Point = (
    ScheduleKind,
    u32,
    u32,
    u32,
    u32,
    &'static str,
    u8,
    bool,
    bool,
);

const GRID: [Point; 12] = {
    use ScheduleKind::*;
    [
        (OneFOneB, 1, 1, 1, 1, "none", 0, false, false),
        (OneFOneB, 2, 1, 2, 1, "selective", 0, false, false),
        (OneFOneB, 4, 1, 1, 2, "full", 1, true, false),
        (OneFOneB, 2, 1, 1, 1, "every:1", 0, false, true),
        (Interleaved1F1B, 2, 2, 1, 2, "selective", 1, true, false),
        (Interleaved1F1B, 4, 2, 2, 1, "none", 0, false, true),
        (
            Interleaved1F1B,
            2,
            2,
            1,
            1,
            "0:full,1:selective,3:every:2",
            0,
            false,
            false,
        ),
        (ZbH1, 2, 1, 2, 2, "full", 1, false, false),
        (ZbH1, 4, 1, 1, 1, "selective", 0, true, false),
        (Zbv, 2, 2, 1, 1, "full", 0, true, false),
        (Zbv, 4, 2, 2, 2, "none", 1, false, false),
        (Zbv, 2, 2, 2, 1, "every:1", 0, false, false),
    ]
};

const M: u32 = 4;

#[test]
fn predicted_stashes_and_optimizer_state_equal_the_measured_bytes_over_the_grid() {
    // vocab 16, seq 8, d_model 16, 2 heads, 8 layers, d_ff 64; 3 sequences a microbatch.
    let model = GptConfig::new(16, 8, 16, 2, 8);
    let shape = ModelShape {
        layers: 8,
        d_model: 16,
        heads: 2,
        ffn: 64,
        seq_len: 8,
        vocab: 16,
    };
    for (kind, pp, v, tp, dp, plan, zero, with_r, bf16) in GRID {
        let at = format!("{kind:?} pp={pp} v={v} tp={tp} dp={dp} {plan} zero={zero} R={with_r}");
        let plan: RecomputePlan = plan.parse().unwrap();
        let mut tt = generate(&ScheduleSpec::new(kind, pp, v, M, None).unwrap());
        if with_r {
            tt = insert(&tt, &plan);
        }
        let cfg = TrainConfig {
            mesh: Mesh::new(pp as usize, tp as usize, dp as usize).unwrap(),
            model,
            microbatch_size: 3,
            seed: 1,
            sequence_parallel: false,
            run: RunOptions {
                steps: 1,
                recompute: plan.clone(),
                zero: Zero::from_level(u32::from(zero), pp as usize).unwrap(),
                precision: if bf16 {
                    Precision::Bf16
                } else {
                    Precision::F32
                },
                ..RunOptions::default()
            },
        };
        let mut measured = None;
        train_gpt(&cfg, &tt, |s| measured = Some(s.clone())).unwrap();
        let measured = measured.unwrap();
        let mem = MemoryConfig {
            precision: if bf16 {
                MemPrecision::Bf16
            } else {
                MemPrecision::F32
            },
            tp,
            dp,
            v,
            microbatch_size: 3,
            zero,
            recompute: plan,
            ..MemoryConfig::new(shape, pp).with_accounting(Accounting::Pipewright)
        };
        let predicted = predict(&mem, &tt).unwrap();
        let activations: Vec<u64> = predicted.iter().map(|m| m.activations).collect();
        assert!(activations.iter().all(|&b| b > 0), "{at}: {activations:?}");
        assert_eq!(activations, measured.peak_stash_bytes, "{at}: stashes");
        // Every rank of a device within its prediction, which the largest rank meets.
        let per_device = (tp * dp) as usize;
        for (d, ranks) in measured
            .optimizer_state_bytes
            .chunks(per_device)
            .enumerate()
        {
            let want = predicted[d].optimizer_state;
            assert_eq!(
                ranks.iter().max(),
                Some(&want),
                "{at}: device {d} {ranks:?}"
            );
        }
    }
}

#[test]
fn predicted_parameters_and_gradients_are_each_rank_s_tensors() {
    // d_ff 48 (not 4 * d_model) and 5 layers over 2 and 4 stages: uneven cuts.
    let model = GptConfig {
        d_ff: 48,
        ..GptConfig::new(11, 6, 16, 4, 5)
    };
    let shape = ModelShape {
        layers: 5,
        d_model: 16,
        heads: 4,
        ffn: 48,
        seq_len: 6,
        vocab: 11,
    };
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
