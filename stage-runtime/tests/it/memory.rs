//! Each rank's measured memory by category equals the closed forms of the reference GPT:
//! parameters and gradients are 4 bytes per parameter of the rank's stages, AdamW's state 8
//! (a ZeRO-1 replica's shard only), activations the stash peaks, and pipeline hand-offs whole
//! activations of one microbatch.

use pipewright_kernels::gpt::{GptConfig, GptStage};
use pipewright_kernels::layers::{Parameters, TpShard};
use pipewright_runtime::{shard_range, train_gpt, Mesh, RunOptions, StepRecord, TrainConfig, Zero};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

const M: u32 = 4;
const B: usize = 2;

fn model() -> GptConfig {
    // vocab 16, seq 8, d_model 16, 2 heads, 4 layers (d_ff = 64).
    GptConfig::new(16, 8, 16, 2, 4)
}

fn train(mesh: Mesh, kind: ScheduleKind, recompute: &str, zero: Zero) -> Vec<StepRecord> {
    let spec = ScheduleSpec::new(kind, mesh.pp as u32, 1, M, None).unwrap();
    let cfg = TrainConfig {
        mesh,
        model: model(),
        microbatch_size: B,
        seed: 3,
        sequence_parallel: false,
        run: RunOptions {
            steps: 2,
            recompute: recompute.parse().unwrap(),
            zero,
            ..RunOptions::default()
        },
    };
    let mut steps = Vec::new();
    train_gpt(&cfg, &Checked::new(generate(&spec)).unwrap(), |s| {
        steps.push(s.clone())
    })
    .unwrap();
    steps
}

/// Parameters of stage `s` of `stages` at TP 1, in closed form.
fn stage_params(s: usize, stages: usize) -> u64 {
    let c = model();
    let (d, f, v) = (c.d_model, c.d_ff, c.vocab);
    let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
    let mut n = block * c.n_layers / stages;
    if s == 0 {
        n += v * d + c.seq_len * d;
    }
    if s + 1 == stages {
        n += 2 * d + d * v + v;
    }
    n as u64
}

#[test]
fn parameters_gradients_and_adamw_state_are_4_4_and_8_bytes_per_parameter() {
    let mesh = Mesh::new(2, 1, 1).unwrap();
    let steps = train(mesh, ScheduleKind::OneFOneB, "none", Zero::Off);
    // Step 0 creates AdamW's state at its end; step 1 holds it throughout.
    let last = &steps[1];
    for s in 0..2 {
        let n = stage_params(s, 2);
        let m = &last.memory[mesh.rank(mesh.coord(s).unwrap())];
        assert_eq!(m.peak.parameters, 4 * n, "stage {s}");
        assert_eq!(m.peak.gradients, 4 * n, "stage {s}");
        assert_eq!(m.peak.optimizer_state, 8 * n, "stage {s}");
        assert_eq!(m.max.optimizer_state, 8 * n, "stage {s}");
        assert_eq!(
            steps[0].memory[s].max.optimizer_state,
            8 * n,
            "step 0 ends with it"
        );
        assert_eq!(m.peak.workspace, 0);
    }
    let whole = model().num_params() as u64;
    assert_eq!(stage_params(0, 2) + stage_params(1, 2), whole);
}

#[test]
fn activations_are_the_stash_peaks_and_1f1b_stashes_most_on_the_first_device() {
    let mesh = Mesh::new(4, 1, 1).unwrap();
    let steps = train(mesh, ScheduleKind::OneFOneB, "none", Zero::Off);
    let last = &steps[1];
    let act: Vec<u64> = (0..4).map(|d| last.memory[d].max.activations).collect();
    assert_eq!(act, last.peak_stash_bytes);
    // 1F1B: device r holds min(p - r, m) microbatches; the last holds one.
    assert!(act[0] > act[3], "{act:?}");
    assert!(act.windows(2).all(|w| w[0] >= w[1]), "{act:?}");
    let full = train(mesh, ScheduleKind::OneFOneB, "full", Zero::Off);
    let full0 = full[1].memory[0].max.activations;
    assert!(full0 < act[0], "full recomputation: {full0} vs {}", act[0]);
    // The peak's total is the highest moment: at least any one category's maximum, at most
    // the sum of the maxima.
    for m in &last.memory {
        for x in [m.max.activations, m.max.buffers, m.max.parameters] {
            assert!(m.peak.total() >= x);
        }
        assert!(m.peak.total() <= m.max.total());
    }
}

#[test]
fn hand_off_buffers_are_whole_activations_of_a_microbatch() {
    let mesh = Mesh::new(2, 1, 1).unwrap();
    let steps = train(mesh, ScheduleKind::OneFOneB, "none", Zero::Off);
    let c = model();
    let hand_off = (4 * B * c.seq_len * c.d_model) as u64;
    for m in &steps[1].memory {
        assert!(m.max.buffers >= hand_off, "{m:?}");
        assert_eq!(m.max.buffers % hand_off, 0, "{m:?}");
    }
}

#[test]
fn zero1_replicas_hold_their_shard_of_adamw_and_reduce_the_flat_gradients() {
    let mesh = Mesh::new(2, 1, 2).unwrap();
    for zero in [Zero::Off, Zero::One] {
        let steps = train(mesh, ScheduleKind::OneFOneB, "none", zero);
        for rank in 0..mesh.world_size() {
            let c = mesh.coord(rank).unwrap();
            let n = stage_params(c.pp, 2);
            let m = &steps[1].memory[rank];
            let state = match zero {
                Zero::One => 8 * shard_range(n as usize, 2, c.dp).len() as u64,
                _ => 8 * n,
            };
            assert_eq!(m.peak.optimizer_state, state, "{zero:?} rank {rank}");
            assert_eq!(m.peak.parameters, 4 * n);
            // The flat gradients (and under ZeRO-1 the gathered values) are buffers.
            assert!(m.max.buffers >= 4 * n, "{zero:?} rank {rank}: {m:?}");
        }
    }
}

#[test]
fn a_tp_rank_holds_its_shard_of_the_parameters() {
    let mesh = Mesh::new(2, 2, 1).unwrap();
    let steps = train(mesh, ScheduleKind::OneFOneB, "none", Zero::Off);
    for rank in 0..mesh.world_size() {
        let c = mesh.coord(rank).unwrap();
        let shard = TpShard::new(c.tp, 2).unwrap();
        let stage = GptStage::new(&model(), 3, c.pp, 2, shard).unwrap();
        let n = stage.num_params() as u64;
        assert!(
            n < stage_params(c.pp, 2),
            "a shard is smaller than the stage"
        );
        assert_eq!(steps[1].memory[rank].peak.parameters, 4 * n);
        assert_eq!(steps[1].memory[rank].peak.gradients, 4 * n);
    }
}
