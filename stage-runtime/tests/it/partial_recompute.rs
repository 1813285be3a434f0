//! A timetable that recomputes only some microbatches of a stage: the memory model's walk
//! counts what the runtime holds to the byte, whatever the policy, wherever the `R` stands
//! (right after its F or right before its backward), with split backwards and F&B overlaps.

use pipewright_kernels::gpt::GptConfig;
use pipewright_model::memory::{predict_detail, Accounting, MemoryConfig, ModelShape};
use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::Checked;
use pipewright_schedule::{
    generate, validate, Action, ActionKind, RecomputePlan, ScheduleKind, ScheduleSpec, Timetable,
};

const B: u64 = 3;

fn shape() -> ModelShape {
    ModelShape::gpt(8, 16, 2, 64, 8, 16)
}

/// An `R` for each (stage, microbatch) of `picks`, right after its F (`early`) or right
/// before its first backward.
fn add_r(tt: &mut Timetable, picks: &[(u32, u32)], early: bool) {
    let at = |row: &[Action], s: u32, mb: u32| {
        let is = |p: Action| p.stage == s && p.microbatch == mb;
        if early {
            let f = row
                .iter()
                .position(|a| a.parts().any(|p| is(p) && p.kind == ActionKind::F));
            f.map(|i| i + 1)
        } else {
            row.iter()
                .position(|a| a.parts().any(|p| is(p) && p.kind.is_input_backward()))
        }
    };
    for row in &mut tt.devices {
        for &(s, mb) in picks {
            if let Some(i) = at(row, s, mb) {
                row.insert(i, Action::new(s, ActionKind::R, mb));
            }
        }
    }
}

fn check(kind: ScheduleKind, (pp, v, m): (u32, u32, u32), plan: &str, picks: &[(u32, u32)]) {
    let plan: RecomputePlan = plan.parse().unwrap();
    for early in [false, true] {
        let mut tt = generate(&ScheduleSpec::new(kind, pp, v, m, None).unwrap());
        add_r(&mut tt, picks, early);
        validate(&tt).unwrap();
        let cfg = TrainConfig {
            mesh: Mesh::new(pp as usize, 1, 1).unwrap(),
            model: GptConfig::new(16, 8, 16, 2, 8),
            microbatch_size: B as usize,
            seed: 1,
            sequence_parallel: false,
            run: RunOptions {
                steps: 2,
                recompute: plan.clone(),
                ..RunOptions::default()
            },
        };
        let mut last = None;
        train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            last = Some(s.clone())
        })
        .unwrap();
        let measured = last.unwrap();
        let model = MemoryConfig {
            v,
            microbatch_size: B,
            recompute: plan.clone(),
            ..MemoryConfig::new(shape(), pp).with_accounting(Accounting::Pipewright)
        };
        let predicted = predict_detail(&model, &tt).unwrap();
        let stashes: Vec<u64> = predicted.iter().map(|d| d.max.activations).collect();
        let peaks: Vec<u64> = predicted.iter().map(|d| d.peak.total()).collect();
        let measured_peaks: Vec<u64> = measured.memory.iter().map(|r| r.peak.total()).collect();
        let case = format!("{kind:?} {plan} R on {picks:?}, early {early}");
        assert_eq!(stashes, measured.peak_stash_bytes, "{case}: stash peaks");
        assert_eq!(peaks, measured_peaks, "{case}: peak totals");
    }
}

#[test]
fn partial_recomputation_is_predicted_to_the_byte() {
    use ScheduleKind::*;
    check(OneFOneB, (2, 1, 4), "none", &[(0, 0), (0, 2)]);
    check(OneFOneB, (2, 1, 4), "selective", &[(0, 1)]);
    check(OneFOneB, (2, 1, 4), "0:every:2", &[(0, 0)]);
    check(OneFOneB, (2, 1, 4), "1:full", &[(0, 0)]);
    check(ZbH1, (2, 1, 4), "none", &[(0, 0), (1, 3)]);
    check(ZbH1, (2, 1, 4), "full", &[(0, 2)]);
    check(Zbv, (2, 2, 4), "selective", &[(0, 0), (3, 1)]);
    check(DualPipeV, (2, 2, 8), "none", &[(0, 0), (3, 5), (1, 6)]);
    check(DualPipeV, (2, 2, 8), "full", &[(0, 4), (2, 6)]);
}
