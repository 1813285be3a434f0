//! The candle bridge: a candle model (examples/candle_stages.rs, residual MLP blocks built
//! with candle_nn) cut into pipeline stages trains with the losses and final weights of
//! plain candle on one device (1e-5), under 1F1B and GPipe at pp=2 and pp=2 x dp=2; a
//! schedule splitting the backward (zb-h1) is refused before the first step.

#[allow(dead_code)]
#[path = "../../examples/candle_stages.rs"]
mod model;

use model::{close, one_device, rows, stage, LAYERS};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_runtime::{run, Mesh, RunOptions, RuntimeError};
use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

const STEPS: u64 = 4;

fn opts() -> RunOptions {
    RunOptions {
        steps: STEPS,
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    }
}

fn train(kind: ScheduleKind, dp: usize) -> Result<Vec<f32>, RuntimeError> {
    let tt = Checked::new(generate(&ScheduleSpec::new(kind, 2, 1, 4, None).unwrap())).unwrap();
    let cuts = [0..3, 3..LAYERS];
    let mut losses = Vec::new();
    run(
        Mesh::new(2, 1, dp).unwrap(),
        &tt,
        |_, s| stage(&cuts, s as usize),
        rows,
        &opts(),
        |s| losses.push(s.loss.unwrap_or(f32::NAN)),
    )?;
    Ok(losses)
}

fn check(kind: ScheduleKind, dp: usize) {
    let piped = train(kind, dp).unwrap();
    let single = one_device(4 * dp as u32, STEPS, &opts().adamw).unwrap();
    assert_eq!(piped.len(), single.len());
    for (step, (a, b)) in piped.iter().zip(&single).enumerate() {
        assert!(
            close(*a, *b),
            "{kind:?} dp={dp} step {step}: {a} vs one device {b}"
        );
    }
    assert!(
        single[STEPS as usize - 1] < single[0],
        "does not train: {single:?}"
    );
}

#[test]
fn one_f_one_b_on_two_devices_equals_plain_candle() {
    check(ScheduleKind::OneFOneB, 1);
}

#[test]
fn gpipe_on_two_devices_equals_plain_candle() {
    check(ScheduleKind::GPipe, 1);
}

#[test]
fn pp2_by_dp2_equals_plain_candle_over_the_global_batch() {
    check(ScheduleKind::OneFOneB, 2);
    check(ScheduleKind::GPipe, 2);
}

#[test]
fn zb_h1_is_refused_before_the_first_step_naming_the_schedule_and_stage() {
    let e = train(ScheduleKind::ZbH1, 1).unwrap_err();
    let RuntimeError::NoSplitBackward {
        schedule, stage, ..
    } = &e
    else {
        panic!("not refused up front: {e}")
    };
    assert_eq!(schedule, "zb-h1");
    assert!(*stage < 2);
    let line = e.to_string();
    assert!(
        line.contains("only a full backward") && !line.contains('\n'),
        "{line}"
    );
}
