//! ZeRO-1 (a sharded optimizer over each stage's data-parallel group) trains to the bits of
//! the unsharded run, holds `1 / dp` of the optimizer state per rank, and refuses a module
//! that cannot shard before the first step.

use pipewright_schedule::Checked;
use std::time::Duration;

use pipewright_kernels::gpt::GptConfig;
use pipewright_runtime::{
    run, train_gpt, FinalParams, Mesh, RunOptions, RuntimeError, StageModule, SyntheticModule,
    TrainConfig, Zero,
};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, Timetable};

fn config(mesh: Mesh, zero: Zero) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 4),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 11,
        run: RunOptions {
            steps: 3,
            zero,
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, v: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, 2, v, 4, None).expect("a valid spec"))
}

type Bits = Vec<Option<u32>>;

fn train(mesh: Mesh, zero: Zero, tt: &Timetable) -> (Bits, FinalParams, Vec<u64>) {
    let (mut losses, mut bytes) = (Vec::new(), Vec::new());
    let params = train_gpt(
        &config(mesh, zero),
        &Checked::new(tt.clone()).unwrap(),
        |s| {
            losses.push(s.loss.map(f32::to_bits));
            bytes = s.optimizer_state_bytes.clone();
        },
    )
    .unwrap_or_else(|e| panic!("{} on {mesh:?} with {zero:?}: {e}", tt.name));
    (losses, params, bytes)
}

/// pp2 x dp2, pp2 x tp2 x dp2 and pp2 x dp3 (shards of unequal length) under 1F1B,
/// interleaved 1F1B and ZB-H1 (its W is the stage's last backward): the same losses and
/// final parameters as without ZeRO, to the bit.
#[test]
fn zero1_trains_to_the_bits_of_zero0() {
    let schedules = [
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
    ];
    for (pp, tp, dp) in [(2, 1, 2), (2, 2, 2), (2, 1, 3)] {
        let mesh = Mesh::new(pp, tp, dp).unwrap();
        for &(kind, v) in &schedules {
            let tt = timetable(kind, v);
            let (want, want_params, _) = train(mesh, Zero::Off, &tt);
            let (got, got_params, _) = train(mesh, Zero::One, &tt);
            assert_eq!(got, want, "{} on {mesh:?}: losses", tt.name);
            assert_eq!(
                got_params, want_params,
                "{} on {mesh:?}: parameters",
                tt.name
            );
        }
    }
}

/// Optimizer-state bytes per rank: at dp = 2 and 4 each replica holds its shard's two f32
/// moments, `1 / dp` of dp = 1's within the padding of one shard, and a stage's replicas
/// together hold exactly dp = 1's; without ZeRO every replica holds all of it.
#[test]
fn each_replica_holds_one_dp_th_of_the_optimizer_state() {
    let tt = timetable(ScheduleKind::OneFOneB, 1);
    let (_, _, full) = train(Mesh::new(2, 1, 1).unwrap(), Zero::One, &tt);
    assert!(full.iter().all(|&b| b > 0), "{full:?}");
    for dp in [2usize, 4] {
        let mesh = Mesh::new(2, 1, dp).unwrap();
        let (_, _, zero0) = train(mesh, Zero::Off, &tt);
        let (_, _, zero1) = train(mesh, Zero::One, &tt);
        for (pp, &whole) in full.iter().enumerate() {
            let ranks: Vec<usize> = (0..dp)
                .map(|d| mesh.rank(pipewright_runtime::Coord { pp, tp: 0, dp: d }))
                .collect();
            let held: Vec<u64> = ranks.iter().map(|&r| zero1[r]).collect();
            assert_eq!(held.iter().sum::<u64>(), whole, "dp {dp}, device {pp}");
            let share = whole as f64 / dp as f64;
            // Shards differ from n / dp by less than one value per rank: 8 bytes each.
            let slack = 8.0 * dp as f64;
            for &b in &held {
                assert!((b as f64 - share).abs() <= slack, "dp {dp}: {b} vs {share}");
            }
            assert!(ranks.iter().all(|&r| zero0[r] == whole));
            eprintln!(
                "device {pp}: dp 1 holds {whole} B; dp {dp} ZeRO-1 holds {held:?} B per rank ({:.4} of dp 1)",
                *held.iter().max().unwrap_or(&0) as f64 / whole as f64
            );
        }
    }
}

/// A module that cannot shard its optimizer is refused before any step, naming its stage;
/// with one replica ZeRO-1 changes nothing, so the same module runs.
#[test]
fn a_module_without_a_sharded_optimizer_is_refused_before_the_first_step() {
    let tt = timetable(ScheduleKind::OneFOneB, 1);
    let make = |_, stage: u32| {
        let m = SyntheticModule {
            f: Duration::ZERO,
            i: Duration::ZERO,
            w: Duration::ZERO,
            activation: 1,
            last: stage == 1,
        };
        assert!(!m.shards_optimizer());
        Ok(m)
    };
    let opts = RunOptions {
        zero: Zero::One,
        ..RunOptions::default()
    };
    let mut steps = 0;
    let e = run(
        Mesh::new(2, 1, 2).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        |_| Ok(()),
        &opts,
        |_| steps += 1,
    )
    .unwrap_err();
    assert!(
        matches!(e, RuntimeError::NoShardedOptimizer { dp: 2, .. }),
        "{e}"
    );
    assert!(e
        .to_string()
        .contains("does not implement optimizer_step_shard"));
    assert_eq!(steps, 0);
    run(
        Mesh::new(2, 1, 1).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        |_| Ok(()),
        &opts,
        |_| {},
    )
    .unwrap();
}
