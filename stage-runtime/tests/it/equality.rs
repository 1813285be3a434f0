//! PP x TP x DP training equals one device: same seed, same global batch, same losses and
//! final parameters within 1e-5, for every schedule.

use crate::whole;
use pipewright_schedule::Checked;

use pipewright_kernels::gpt::GptConfig;
use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::{generate, Placement, ScheduleKind, ScheduleSpec, Timetable};
use pipewright_search::{list_schedule, stage_weights, Knobs};
use pipewright_sim::{simulate, CostModel, StageCost};
use whole::{check_params, close, single_device};

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
    let params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.unwrap())
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (want, whole) = single_device(&cfg, m, STEPS);
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
        let predicted: Vec<u32> = simulate(&Checked::new(tt.clone()).unwrap(), &costs)
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
        train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            measured = s.peak_stash.clone()
        })
        .unwrap();
        assert_eq!(measured, predicted, "{spec}");
    }
}
