//! The runtime's speed targets (issue 5), timed as steps inside one run so thread start-up and
//! model initialisation are not counted (`iter_custom` sums the recorded step times):
//! - overhead per action: synthetic stages of zero duration (target < 10 us per action);
//! - synthetic stages of exact durations against the simulator's makespan (target within 3%);
//! - pp=2 against one device on the reference GPT at a compute-bound size (target >= 1.6x).
//!
//! Read the figures as ratios within one run: this machine is shared and noisy.

use std::time::Duration;

#[path = "common/gpt_steps.rs"]
mod common;
use common::{gpt_steps, gpt_timetable};

use criterion::{criterion_group, criterion_main, Criterion};
use pipewright::runtime::split::LayerCost;
use pipewright::runtime::{run, Coord, Mesh, RunOptions, SyntheticModule};
use pipewright::schedule::{
    generate, simulate, Checked, CostModel, ScheduleKind, ScheduleSpec, StageCost,
};

fn timetable(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Checked {
    let tt = generate(&ScheduleSpec::new(kind, p, v, m, None).expect("valid spec"));
    Checked::new(tt).expect("a generated timetable is valid")
}

/// Seconds of `steps` recorded steps of synthetic stages: a device's share takes `f`/`b`
/// milliseconds (W half of B), split evenly over its chunks.
fn synthetic_steps(tt: &Checked, f_ms: f64, b_ms: f64, steps: u64) -> Duration {
    let v = tt.num_stages() / tt.num_devices();
    let cost = StageCost::new(f_ms, b_ms, None).expect("costs").split(v);
    let last = tt.num_stages() - 1;
    let (f, i, w) = (cost.f, cost.i, cost.w);
    let cost = LayerCost { f, i, w };
    let make = |_: Coord, s: u32| Ok(SyntheticModule::from_ms(&cost, s == last));
    let data = |_| Ok(());
    let opts = RunOptions {
        steps,
        ..RunOptions::default()
    };
    let mesh = Mesh::new(tt.num_devices() as usize, 1, 1).expect("mesh");
    let mut total = 0.0;
    run(mesh, tt, make, data, &opts, |s| total += s.seconds).expect("run");
    Duration::from_secs_f64(total)
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("runtime overhead");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    let tt = timetable(ScheduleKind::OneFOneB, 4, 1, 64);
    let actions = tt.len();
    group.bench_function(
        format!("1f1b p=4 m=64, zero-time stages, {actions} compute actions per step"),
        |b| b.iter_custom(|iters| synthetic_steps(&tt, 0.0, 0.0, iters)),
    );
    group.finish();
}

fn against_simulator(c: &mut Criterion) {
    let mut group = c.benchmark_group("runtime vs simulator");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    for (kind, v) in [
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
    ] {
        let tt = timetable(kind, 4, v, 16);
        let costs = CostModel::uniform(
            4 * v,
            StageCost::new(2.0, 4.0, None).expect("costs").split(v),
        );
        let predicted = simulate(&tt, &costs).expect("simulates").report.makespan;
        group.bench_function(
            format!("{kind} p=4 v={v} m=16 F=2ms B=4ms (simulated {predicted:.2} ms)"),
            |b| b.iter_custom(|iters| synthetic_steps(&tt, 2.0, 4.0, iters)),
        );
    }
    group.finish();
}

fn pipeline_speedup(c: &mut Criterion) {
    let mut group = c.benchmark_group("gpt step, 4 layers d=256 seq=64, m=8 of 4 sequences");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for pp in [1, 2] {
        group.bench_function(format!("pp={pp}"), |b| {
            let tt = gpt_timetable(ScheduleKind::OneFOneB, pp, 1);
            b.iter_custom(|iters| gpt_steps(&tt, 0, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, overhead, against_simulator, pipeline_speedup);
criterion_main!(benches);
