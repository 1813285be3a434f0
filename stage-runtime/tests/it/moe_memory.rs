//! The memory model's pipewright accounting against the runtime on two mixtures of experts:
//! A (GeLU, 4 experts of width 16, top-2, a shared expert of width 8, the first block dense,
//! no biases) and B (SwiGLU, 8 experts of width 8, top-2, every block a mixture, a QKV bias),
//! at pp 2 (1F1B, interleaved 1F1B and ZB-H1; recompute none, selective, every:1 and full)
//! and pp 2 x dp 2 x ep 2 (1F1B, interleaved 1F1B and GPipe). Parameters, gradients,
//! AdamW's state and buffers equal the prediction to the byte on every rank; without expert
//! parallelism so do the stashes. Under EP a rank stashes the copies its experts received,
//! which depends on the routing, so there the prediction (`N k` copies a rank, the average)
//! is the EP group's mean: on GPipe, where every rank's peak holds all the microbatches, the
//! group's stashes add up to `ep` times it to the byte.

use pipewright_model::memory::{
    moe::ExpertLayout, predict_detail, Accounting, DevicePrediction, MemoryBreakdown, MemoryConfig,
};
use pipewright_model::shape::{BiasKind, MlpKind, ModelShape, MoeShape};
use pipewright_runtime::{gpt_config, train_gpt, Mesh, RunOptions, StepRecord, TrainConfig};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

const M: u32 = 4;

fn mixture(experts: u32, expert_ffn: u64, shared_ffn: u64, dense_layers: u32) -> MoeShape {
    MoeShape {
        route_groups: None,
        experts,
        top_k: 2,
        expert_ffn,
        shared_experts: u32::from(shared_ffn > 0),
        shared_ffn,
        shared_gate: false,
        router_bias: false,
        dense_layers,
        every: 1,
    }
}

/// A and B, 4 blocks of width 16 with 4 heads, seq 8, vocab 32.
fn shapes() -> [(&'static str, ModelShape); 2] {
    let base = ModelShape::gpt(4, 16, 4, 64, 8, 32);
    [
        (
            "A",
            ModelShape {
                bias: BiasKind::None,
                moe: Some(mixture(4, 16, 8, 1)),
                ..base
            },
        ),
        (
            "B",
            ModelShape {
                mlp: MlpKind::SwiGlu,
                bias: BiasKind::Qkv,
                moe: Some(mixture(8, 8, 0, 0)),
                ..base
            },
        ),
    ]
}

/// Two steps of `shape` at `(pp, v, dp, ep)` under `kind` and `recompute`: the second step's
/// record and the prediction per device.
fn run(
    shape: &ModelShape,
    kind: ScheduleKind,
    (pp, v, dp, ep): Dims,
    recompute: &str,
) -> (StepRecord, Vec<DevicePrediction>) {
    let tt = generate(&ScheduleSpec::new(kind, pp, v, M, None).unwrap());
    let plan: pipewright_schedule::RecomputePlan = recompute.parse().unwrap();
    let mesh = Mesh::new(pp as usize, 1, dp as usize)
        .unwrap()
        .with_ep(ep as usize)
        .unwrap();
    let cfg = TrainConfig {
        mesh,
        model: gpt_config(shape).unwrap(),
        microbatch_size: 2,
        seed: 3,
        sequence_parallel: false,
        run: RunOptions {
            steps: 2,
            recompute: plan.clone(),
            ..RunOptions::default()
        },
    };
    let mut measured = None;
    train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        measured = Some(s.clone())
    })
    .unwrap();
    let mem = MemoryConfig {
        dp,
        v,
        microbatch_size: 2,
        recompute: plan,
        experts: ExpertLayout {
            ep,
            ..ExpertLayout::default()
        },
        ..MemoryConfig::new(*shape, pp).with_accounting(Accounting::Pipewright)
    };
    (measured.unwrap(), predict_detail(&mem, &tt).unwrap())
}

/// `(pp, v, dp, ep)`.
type Dims = (u32, u32, u32, u32);

const POINTS: [(ScheduleKind, Dims, &str); 5] = {
    use ScheduleKind::*;
    [
        (OneFOneB, (2, 1, 1, 1), "none"),
        (Interleaved1F1B, (2, 2, 1, 1), "selective"),
        (ZbH1, (2, 1, 1, 1), "none"),
        (OneFOneB, (2, 1, 1, 1), "every:1"),
        (OneFOneB, (2, 1, 1, 1), "full"),
    ]
};

#[test]
fn without_ep_every_category_of_every_rank_equals_the_prediction() {
    for (name, shape) in shapes() {
        for (kind, dims, recompute) in POINTS {
            let at = format!("{name} {kind:?} {dims:?} {recompute}");
            let (measured, predicted) = run(&shape, kind, dims, recompute);
            for (d, want) in predicted.iter().enumerate() {
                let m = &measured.memory[d];
                println!("{at}: device {d}: {:?}", m.peak);
                assert_eq!(m.peak, want.peak, "{at}: device {d} peak");
                assert_eq!(m.max, want.max, "{at}: device {d} max");
            }
        }
    }
}

/// Parameters, gradients, AdamW's state and buffers of a rank.
fn state(b: &MemoryBreakdown) -> (u64, u64, u64, u64) {
    (b.parameters, b.gradients, b.optimizer_state, b.buffers)
}

#[test]
fn under_ep_the_state_equals_the_prediction_and_the_stashes_average_it() {
    use ScheduleKind::*;
    for (name, shape) in shapes() {
        for (kind, v) in [(OneFOneB, 1), (Interleaved1F1B, 2), (GPipe, 1)] {
            let at = format!("{name} {kind:?} pp 2 v {v} dp 2 ep 2");
            let (measured, predicted) = run(&shape, kind, (2, v, 2, 2), "none");
            for (d, ranks) in measured.memory.chunks(2).enumerate() {
                let want = &predicted[d];
                for (r, m) in ranks.iter().enumerate() {
                    println!("{at}: device {d} rank {r}: {:?}", m.peak);
                    let at = format!("{at}: device {d} rank {r}");
                    assert_eq!(state(&m.peak), state(&want.peak), "{at}");
                    assert_eq!(state(&m.max), state(&want.max), "{at}");
                }
                // GPipe's peak holds every microbatch's stash on every rank at once, and the
                // EP group's experts received all `2 N k` copies of each microbatch: the
                // group's stashes add up to ep times the prediction, to the byte.
                let acts: Vec<u64> = ranks.iter().map(|m| m.max.activations).collect();
                let want = want.max.activations;
                println!("{at}: device {d}: stashes {acts:?}, predicted {want}");
                if kind == GPipe {
                    assert_eq!(acts.iter().sum::<u64>(), 2 * want, "{at}: device {d}");
                }
            }
        }
    }
}
