//! A layer-list model's memory predicted from its profile (the schedule crate's
//! `predict_layers`) against the runtime's measurement of the same model: the user MLP of
//! `common/user_mlp.rs` profiled by `split::layer_profile`, cut where the profile says
//! (`LayerProfile::cuts`) and trained on 2 pipeline devices under 1F1B, interleaved 1F1B and
//! ZB-H1, with and without full recomputation (by policy and by explicit `R` actions),
//! ZeRO-1 at dp 2. Every category of every device's peak, and each category's maximum, is
//! equal to the byte; the stashes are not 0.

use pipewright_kernels::init::normal_tensor;
use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::{predict_layers, DevicePrediction, LayerMemoryConfig};
use pipewright_runtime::split::layer_profile;
use pipewright_runtime::{run, Mesh, RunOptions, StepRecord, Zero};
use pipewright_schedule::recompute::insert;
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec};

use crate::user_mlp;

const LAYERS: usize = 8;
const M: u32 = 4;

/// (family, v, dp, recompute, zero, explicit R actions)
type Point = (ScheduleKind, u32, u32, &'static str, u8, bool);

const GRID: [Point; 8] = {
    use ScheduleKind::*;
    [
        (OneFOneB, 1, 1, "none", 0, false),
        (OneFOneB, 1, 2, "full", 1, false),
        (OneFOneB, 1, 2, "none", 1, false),
        (Interleaved1F1B, 2, 1, "full", 0, false),
        (Interleaved1F1B, 2, 2, "none", 1, false),
        (Interleaved1F1B, 2, 2, "full", 1, true),
        (ZbH1, 1, 1, "none", 0, false),
        (ZbH1, 1, 2, "full", 0, true),
    ]
};

/// The user MLP profiled on one microbatch of 8 rows (the rows `user_mlp::rows` makes).
fn profiled() -> LayerProfile {
    let mut layers = user_mlp::model(LAYERS);
    let sample = normal_tensor(&[8, 4], 1.0, 0, "sample");
    layer_profile(&mut layers, &sample, 8, 1, "this CPU").unwrap()
}

fn run_point(p: &Point, profile: &LayerProfile) -> (StepRecord, Vec<DevicePrediction>) {
    let &(kind, v, dp, policy, zero, with_r) = p;
    let plan: RecomputePlan = policy.parse().unwrap();
    let mut tt = generate(&ScheduleSpec::new(kind, 2, v, M, None).unwrap());
    if with_r {
        tt = insert(&tt, &plan);
    }
    let cuts = profile.cuts(tt.num_stages() as usize).unwrap();
    let opts = RunOptions {
        steps: 2,
        recompute: if with_r {
            RecomputePlan::default()
        } else {
            plan.clone()
        },
        zero: Zero::from_level(u32::from(zero), 2).unwrap(),
        ..RunOptions::default()
    };
    let mesh = Mesh::new(2, 1, dp as usize).unwrap();
    let mut measured = None;
    let make = |_, s: u32| Ok(user_mlp::stage(cuts[s as usize].clone(), LAYERS));
    run(
        mesh,
        &Checked::new(tt.clone()).unwrap(),
        make,
        user_mlp::rows,
        &opts,
        |s| measured = Some(s.clone()),
    )
    .unwrap();
    let measured = measured.unwrap();
    assert_eq!(measured.step, 1);
    let cfg = LayerMemoryConfig {
        profile,
        cuts,
        dp,
        microbatch_size: 8,
        zero,
        recompute: if with_r {
            RecomputePlan::default()
        } else {
            plan
        },
    };
    (measured, predict_layers(&cfg, &tt).unwrap())
}

#[test]
fn memory_predicted_from_a_profile_equals_the_measured_memory_to_the_byte() {
    let profile = profiled();
    assert!(profile.layers.iter().all(|l| l.stash_bytes > 0));
    for p in &GRID {
        let at = format!("{p:?}");
        let (measured, predicted) = run_point(p, &profile);
        let mesh = Mesh::new(2, 1, p.2 as usize).unwrap();
        let stashes: Vec<u64> = predicted.iter().map(|d| d.max.activations).collect();
        assert!(stashes.iter().all(|&b| b > 0), "{at}: {stashes:?}");
        assert_eq!(stashes, measured.peak_stash_bytes, "{at}: stashes");
        assert_eq!(
            measured.device_peaks(&mesh),
            predicted.iter().map(|d| d.peak).collect::<Vec<_>>(),
            "{at}: device peaks"
        );
        for (d, ranks) in measured.memory.chunks(p.2 as usize).enumerate() {
            let largest = ranks.iter().max_by_key(|m| m.peak.total()).unwrap();
            assert_eq!(largest.max, predicted[d].max, "{at}: device {d} maxima");
        }
    }
}

#[test]
fn full_recomputation_keeps_less_than_keeping_everything() {
    let profile = profiled();
    let none = run_point(&GRID[2], &profile).1;
    let full = run_point(&GRID[1], &profile).1;
    assert!(full[0].peak.activations < none[0].peak.activations);
}
