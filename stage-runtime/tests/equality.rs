//! PP x TP x DP training equals one device: same seed, same global batch, same losses and
//! final parameters within 1e-5, for every schedule.

use std::collections::HashMap;

use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, StageOutput};
use pipewright_kernels::layers::shard::{shard_cols, shard_rows};
use pipewright_kernels::layers::{NoTp, Param, Parameters, TpShard};
use pipewright_kernels::optim::AdamW;
use pipewright_kernels::Tensor;
use pipewright_runtime::data::progression_batch;
use pipewright_runtime::{train_gpt, FinalParams, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::search::{list_schedule, stage_weights, Knobs};
use pipewright_schedule::{
    generate, simulate, CostModel, Placement, ScheduleKind, ScheduleSpec, StageCost, Timetable,
};

const STEPS: u64 = 3;
const M: u32 = 4;

fn config(mesh: Mesh) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 8),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 11,
        run: RunOptions {
            steps: STEPS,
            ..RunOptions::default()
        },
    }
}

/// One device, the whole global batch as `dp * m` accumulated microbatches.
fn single_device(cfg: &TrainConfig, m: u32) -> (Vec<f32>, GptStage) {
    let mut whole = GptStage::whole(&cfg.model, cfg.seed).unwrap();
    let mut opt = AdamW::new(whole.num_params(), cfg.run.adamw);
    let n = cfg.mesh.dp as u64 * u64::from(m);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let mut loss = 0.0;
        for j in 0..n {
            let (tokens, targets) = progression_batch(
                cfg.seed,
                step,
                j,
                cfg.microbatch_size,
                cfg.model.seq_len,
                cfg.model.vocab,
            );
            let mb = Microbatch {
                tokens: &tokens,
                targets: &targets,
                seq: cfg.model.seq_len,
                loss_scale: 1.0 / n as f32,
            };
            let (out, stash) = whole.forward(&mb, None, &mut NoTp).unwrap();
            let StageOutput::Loss(l) = out else {
                panic!("whole model ends in a loss")
            };
            loss += l;
            whole.backward(stash, None, &mut NoTp).unwrap();
        }
        opt.step(&mut whole).unwrap();
        whole.zero_grad();
        losses.push(loss);
    }
    (losses, whole)
}

/// What a TP shard of a whole-model parameter holds (the split documented in kernels' shard.rs).
fn shard_of(name: &str, full: &Tensor, tp: TpShard) -> Tensor {
    if name.contains("attn.qkv.") {
        shard_cols(full, 3, tp).unwrap()
    } else if name.contains("mlp.fc1.") {
        shard_cols(full, 1, tp).unwrap()
    } else if name.ends_with("attn.proj.weight") || name.ends_with("mlp.fc2.weight") {
        shard_rows(full, tp).unwrap()
    } else {
        full.clone()
    }
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

fn check_params(cfg: &TrainConfig, stages: usize, got: &FinalParams, whole: &GptStage, what: &str) {
    let mut full: HashMap<String, Tensor> = HashMap::new();
    whole.visit(&mut |p: &Param| {
        full.insert(p.name.clone(), p.value.clone());
    });
    assert_eq!(
        got.len(),
        stages * cfg.mesh.tp,
        "{what}: one parameter set per stage and shard"
    );
    for (&(stage, tp), flat) in got {
        let shard = TpShard::new(tp, cfg.mesh.tp).unwrap();
        let layout = GptStage::new(&cfg.model, cfg.seed, stage as usize, stages, shard).unwrap();
        let mut offset = 0;
        layout.visit(&mut |p: &Param| {
            let want = shard_of(&p.name, &full[&p.name], shard);
            let n = want.numel();
            let have = &flat[offset..offset + n];
            for (i, (&a, &b)) in have.iter().zip(want.data()).enumerate() {
                assert!(
                    close(a, b),
                    "{what}: stage {stage} tp {tp} {}[{i}]: {a} vs {b}",
                    p.name
                );
            }
            offset += n;
        });
        assert_eq!(offset, flat.len(), "{what}: stage {stage} tp {tp}");
    }
}

fn check(kind: ScheduleKind, v: u32, pp: usize, tp: usize, dp: usize) {
    check_m(kind, v, pp, tp, dp, M)
}

fn check_m(kind: ScheduleKind, v: u32, pp: usize, tp: usize, dp: usize, m: u32) {
    let spec = ScheduleSpec::new(kind, pp as u32, v, m, None).unwrap();
    let what = format!("{spec} tp={tp} dp={dp}");
    check_timetable(&generate(&spec), &what, (pp, tp, dp));
}

/// Train `tt` on the mesh and compare with one device.
fn check_timetable(tt: &Timetable, what: &str, (pp, tp, dp): (usize, usize, usize)) {
    let cfg = config(Mesh::new(pp, tp, dp).unwrap());
    let m = tt.microbatches;
    let mut losses = Vec::new();
    let params = train_gpt(&cfg, tt, |s| losses.push(s.loss.unwrap()))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (want, whole) = single_device(&cfg, m);
    assert_eq!(losses.len(), want.len());
    for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
        assert!(close(*a, *b), "{what}: step {step} loss {a} vs {b}");
    }
    assert!(
        want[STEPS as usize - 1] < want[0],
        "the run trains: {want:?}"
    );
    check_params(&cfg, tt.num_stages() as usize, &params, &whole, what);
}

const MESHES: [(usize, usize, usize); 5] = [(2, 1, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)];

#[test]
fn gpipe_equals_one_device_on_every_mesh() {
    MESHES
        .iter()
        .for_each(|&(pp, tp, dp)| check(ScheduleKind::GPipe, 1, pp, tp, dp));
}

#[test]
fn one_f_one_b_equals_one_device_on_every_mesh() {
    MESHES
        .iter()
        .for_each(|&(pp, tp, dp)| check(ScheduleKind::OneFOneB, 1, pp, tp, dp));
}

#[test]
fn interleaved_v2_equals_one_device_on_every_mesh() {
    MESHES
        .iter()
        .for_each(|&(pp, tp, dp)| check(ScheduleKind::Interleaved1F1B, 2, pp, tp, dp));
}

#[test]
fn zero_bubble_v_shape_and_dualpipev_schedules_equal_one_device() {
    for &(pp, tp, dp) in &[(2, 1, 1), (4, 1, 1), (2, 2, 2)] {
        check(ScheduleKind::LoopedBfs, 2, pp, tp, dp);
        check(ScheduleKind::ZbH1, 1, pp, tp, dp);
        check(ScheduleKind::ZbH2, 1, pp, tp, dp);
        check(ScheduleKind::Zbv, 2, pp, tp, dp);
        check_m(ScheduleKind::DualPipeV, 2, pp, tp, dp, 2 * pp as u32);
    }
}

#[test]
fn the_searchs_list_schedules_equal_one_device() {
    for (v, placement, split, cap) in [
        (1, Placement::Loop, true, 2.0),
        (2, Placement::Loop, true, 3.0),
        (2, Placement::V, true, 1.5),
        (2, Placement::V, false, 4.0),
    ] {
        for &(pp, tp, dp) in &[(2, 1, 1), (4, 1, 1), (2, 2, 2)] {
            let p = pp as u32;
            let costs = CostModel::uniform(p * v, StageCost::new(1.0, 2.0, None).unwrap().split(v));
            let knobs = Knobs {
                v,
                placement,
                split,
                backward_first: true,
                depth_first: true,
                cap,
                // The lookahead reorders work; training must not notice.
                lookahead: split,
                w_in_gaps: split,
            };
            let tt = list_schedule(p, M, &costs, &stage_weights(&costs, p), knobs).unwrap();
            let what = format!("{} p={p} tp={tp} dp={dp}", knobs.label());
            check_timetable(&tt, &what, (pp, tp, dp));
        }
    }
}

#[test]
fn measured_peak_stash_equals_the_simulated_peak() {
    for (kind, v, p) in [
        (ScheduleKind::GPipe, 1, 4),
        (ScheduleKind::OneFOneB, 1, 4),
        (ScheduleKind::Interleaved1F1B, 2, 4),
        (ScheduleKind::ZbH1, 1, 4),
        (ScheduleKind::ZbH2, 1, 4),
        (ScheduleKind::Zbv, 2, 4),
        (ScheduleKind::DualPipeV, 2, 2),
    ] {
        let spec = ScheduleSpec::new(kind, p, v, M, None).unwrap();
        let tt = generate(&spec);
        let costs = CostModel::uniform(spec.stages(), StageCost::new(1.0, 2.0, None).unwrap());
        let predicted: Vec<u32> = simulate(&tt, &costs)
            .unwrap()
            .report
            .devices
            .iter()
            .map(|d| d.peak_activations)
            .collect();
        let cfg = TrainConfig {
            run: RunOptions {
                steps: 1,
                ..RunOptions::default()
            },
            ..config(Mesh::new(p as usize, 1, 1).unwrap())
        };
        let mut measured = Vec::new();
        train_gpt(&cfg, &tt, |s| measured = s.peak_stash.clone()).unwrap();
        assert_eq!(measured, predicted, "{spec}");
    }
}
