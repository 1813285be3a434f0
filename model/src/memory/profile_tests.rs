//! The recorded walk against the walk itself, over every family, small pipelines, every
//! recompute plan and a dense and a mixture shape.

use super::*;
use crate::memory::{predict, Accounting, MemPrecision, ModelShape};
use crate::shape::{BiasKind, MoeShape};
use pipewright_schedule::action::ActionKind;
use pipewright_schedule::generate;
use pipewright_schedule::recompute::{insert, Recompute, RecomputePlan};
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
use pipewright_schedule::timetable::Timetable;

fn shapes() -> [ModelShape; 2] {
    let dense = ModelShape::gpt(12, 64, 4, 256, 32, 96);
    let moe = MoeShape {
        route_groups: None,
        experts: 4,
        top_k: 2,
        expert_ffn: 32,
        shared_experts: 1,
        shared_ffn: 16,
        shared_gate: false,
        router_bias: false,
        dense_layers: 1,
        every: 1,
    };
    let mixture = ModelShape {
        bias: BiasKind::None,
        moe: Some(moe),
        ..dense
    };
    [dense, mixture]
}

/// Recompute plans over `stages` stages: none, each policy on every stage, and full on the
/// first stage only.
fn plans(stages: u32) -> Vec<RecomputePlan> {
    let mut out: Vec<RecomputePlan> = [
        Recompute::None,
        Recompute::Full,
        Recompute::Selective,
        Recompute::Every(1),
    ]
    .map(RecomputePlan::uniform)
    .into();
    if stages > 1 {
        let mut first = RecomputePlan::uniform(Recompute::None);
        first.stages.insert(0, Recompute::Full);
        out.push(first);
    }
    out
}

/// Configurations of one shape over a pipeline of `pp` devices and `v` chunks each.
fn configs(shape: ModelShape, pp: u32, v: u32, plan: &RecomputePlan) -> Vec<MemoryConfig> {
    let base = MemoryConfig {
        v,
        recompute: plan.clone(),
        precision: MemPrecision::Bf16,
        ..MemoryConfig::new(shape, pp)
    };
    let mut out = vec![
        base.clone(),
        MemoryConfig {
            tp: 2,
            sequence_parallel: true,
            microbatch_size: 3,
            ..base.clone()
        },
        MemoryConfig {
            dp: 2,
            zero: 1,
            ..base.clone()
        },
    ];
    // The reference GPT's accounting reduces gradients into buffers: walked as before.
    if shape.moe.is_none() {
        out.push(MemoryConfig {
            dp: 2,
            zero: 1,
            ..base.with_accounting(Accounting::Pipewright)
        });
    }
    out
}

#[test]
fn the_recorded_walk_predicts_what_the_walk_does() {
    let (mut compared, mut recorded) = (0, 0);
    for kind in ScheduleKind::ALL {
        for pp in 1..=4u32 {
            for v in 1..=3u32 {
                for m in [1, 2, 3, 5, 8, 13] {
                    let Ok(spec) = ScheduleSpec::new(kind, pp, v, m, None) else {
                        continue;
                    };
                    let plain = generate(&spec);
                    for plan in plans(pp * v) {
                        // The timetable with R actions, as the plan writes it, and without
                        // them (the memory model then rebuilds a slim stash in the backward).
                        let with = insert(&plain, &plan);
                        for tt in [some_rs_dropped(&with), with, plain.clone()] {
                            let profile = Profile::new(&tt).unwrap();
                            for shape in shapes() {
                                for cfg in configs(shape, pp, v, &plan) {
                                    let want = predict(&cfg, &tt);
                                    let got = predict_profiled(&cfg, &profile);
                                    assert_eq!(got, want, "{kind} pp {pp} v {v} m {m} {cfg:?}");
                                    compared += 1;
                                    recorded += usize::from(replayed(&cfg, &profile));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 5000, "{compared} compared");
    assert!(
        recorded * 10 > compared * 7,
        "{recorded} of {compared} replayed"
    );
}

/// `tt` without the `R`s of odd microbatches: a stage then keeps those whole.
fn some_rs_dropped(tt: &Timetable) -> Timetable {
    let mut out = tt.clone();
    for row in &mut out.devices {
        row.retain(|a| a.kind != ActionKind::R || a.microbatch % 2 == 0);
    }
    out
}

/// Whether `cfg` over `profile` is answered from the recorded walk, not by walking.
fn replayed(cfg: &MemoryConfig, profile: &Profile) -> bool {
    let Ok((_, stages, buffers)) = prepare(cfg, &profile.tt, &profile.recomputed) else {
        return false;
    };
    symbolic_handoff(&stages, &buffers)
        .is_some_and(|h| profile.devices.iter().all(|d| d.peak(&stages, h).is_some()))
}

#[test]
fn a_sum_past_2_to_the_53_is_walked() {
    let shape = ModelShape::gpt(8, 1 << 20, 16, 1 << 22, 1 << 20, 256);
    let cfg = MemoryConfig {
        microbatch_size: 1 << 16,
        ..MemoryConfig::new(shape, 2)
    };
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let profile = Profile::new(&tt).unwrap();
    assert!(!replayed(&cfg, &profile));
    assert_eq!(predict_profiled(&cfg, &profile), predict(&cfg, &tt));
}

/// Two moments of the same height, the first all stash, the second half hand-off: the walk
/// keeps the first highest (it replaces its peak only on a strictly higher sum), and so
/// does the replay.
#[test]
fn of_two_equal_moments_the_first_is_the_peak() {
    let moments = Moments {
        stages: vec![0],
        columns: vec![(0, KEPT)],
        coefs: vec![2, 0, 1, 1],
        most: 2,
    };
    let stage = StageBytes::plain(5.0, 0.0);
    assert_eq!(moments.peak(&[stage], 5.0), Some((10.0, 0.0)));
    let later = Moments {
        coefs: vec![1, 1, 2, 0],
        ..moments
    };
    assert_eq!(later.peak(&[stage], 5.0), Some((5.0, 5.0)));
}
