//! Sequence parallelism (`TrainConfig::sequence_parallel`) trains the losses and parameters of
//! tensor parallelism without it, stashes fewer bytes per rank, and refuses a sequence the
//! TP group does not divide before the first step.

use pipewright_kernels::gpt::GptConfig;
use pipewright_runtime::{train_gpt, FinalParams, Mesh, RunOptions, RuntimeError, TrainConfig};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec, Timetable};

fn config(mesh: Mesh, sp: bool, recompute: &str) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 4),
        microbatch_size: 2,
        sequence_parallel: sp,
        seed: 5,
        run: RunOptions {
            steps: 3,
            recompute: recompute.parse::<RecomputePlan>().unwrap(),
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, v: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, 2, v, 4, None).expect("a valid spec"))
}

struct Trained {
    losses: Vec<f32>,
    params: FinalParams,
    stash_bytes: Vec<u64>,
}

fn train(cfg: &TrainConfig, tt: &Timetable) -> Result<Trained, RuntimeError> {
    let (mut losses, mut stash_bytes) = (Vec::new(), Vec::new());
    let params = train_gpt(cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.expect("the GPT has a loss"));
        stash_bytes = s.peak_stash_bytes.clone();
    })?;
    Ok(Trained {
        losses,
        params,
        stash_bytes,
    })
}

/// pp2 x tp2 under 1F1B, interleaved 1F1B and ZB-H1 (split I and W), pp2 x tp2 x dp2 under
/// 1F1B, and full and selective recomputation with SP: losses within 1e-5 (relative) and
/// every parameter of every TP shard within 1e-5 of TP without SP; fewer stash bytes.
#[test]
fn sequence_parallel_trains_as_tensor_parallel() {
    let cases = [
        ((2, 2, 1), ScheduleKind::OneFOneB, 1, "none"),
        ((2, 2, 1), ScheduleKind::Interleaved1F1B, 2, "none"),
        ((2, 2, 1), ScheduleKind::ZbH1, 1, "none"),
        ((2, 2, 2), ScheduleKind::OneFOneB, 1, "none"),
        ((2, 2, 1), ScheduleKind::OneFOneB, 1, "full"),
        ((2, 2, 1), ScheduleKind::OneFOneB, 1, "selective"),
    ];
    for ((pp, tp, dp), kind, v, rc) in cases {
        let mesh = Mesh::new(pp, tp, dp).unwrap();
        let tt = timetable(kind, v);
        let what = format!("{} on {mesh:?}, recompute {rc}", tt.name);
        let want = train(&config(mesh, false, rc), &tt).unwrap();
        let got = train(&config(mesh, true, rc), &tt).unwrap();
        for (a, b) in want.losses.iter().zip(&got.losses) {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "{what}: loss {b} vs {a}");
        }
        assert_eq!(want.losses.len(), got.losses.len());
        assert_eq!(
            want.params.keys().collect::<Vec<_>>(),
            got.params.keys().collect::<Vec<_>>()
        );
        for (key, w) in &want.params {
            let g = &got.params[key];
            let diff = w
                .iter()
                .zip(g)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                diff <= 1e-5,
                "{what}: stage/tp {key:?} parameters differ by {diff}"
            );
        }
        for (d, (a, b)) in want.stash_bytes.iter().zip(&got.stash_bytes).enumerate() {
            assert!(
                b < a,
                "{what}: device {d} stashes {b} bytes with SP, {a} without"
            );
        }
    }
}

#[test]
fn a_sequence_the_tp_group_does_not_divide_is_refused() {
    let mut cfg = config(Mesh::new(2, 2, 1).unwrap(), true, "none");
    cfg.model = GptConfig::new(16, 7, 16, 2, 4);
    let err = train(&cfg, &timetable(ScheduleKind::OneFOneB, 1))
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("the sequence length 7 is not divisible by 2"),
        "{err}"
    );
}
