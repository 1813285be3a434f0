//! Speed of the schedule engine: generate + lower + validate + simulate.
//!
//! Targets (issue 2): interleaved-1f1b p=32 v=4 m=256 (65,536 compute actions) under 20 ms;
//! p=64 v=8 m=1024 (1,048,576 compute actions) under 1 s. Figures in BENCHMARKS.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use pipewright::schedule::{
    generate, lower, simulate, validate, Checked, CostModel, ScheduleKind, ScheduleSpec, StageCost,
};

fn spec(p: u32, v: u32, m: u32) -> ScheduleSpec {
    ScheduleSpec::new(ScheduleKind::Interleaved1F1B, p, v, m, None).unwrap()
}

fn costs(spec: &ScheduleSpec) -> CostModel {
    let mut c = CostModel::uniform(spec.stages(), StageCost::new(1.0, 2.0, None).unwrap());
    c.p2p_latency = 0.05;
    c
}

fn pipeline(c: &mut Criterion) {
    let mut group = c.benchmark_group("generate+lower+validate+simulate");
    for (p, v, m, secs) in [(32, 4, 256, 5), (64, 8, 1024, 20)] {
        let spec = spec(p, v, m);
        let costs = costs(&spec);
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(secs));
        group.bench_function(format!("interleaved p={p} v={v} m={m}"), |b| {
            b.iter(|| {
                let tt = generate(black_box(&spec));
                let low = Checked::new(lower(&tt).unwrap()).unwrap();
                simulate(&low, &costs).unwrap().report.makespan
            })
        });
    }
    group.finish();
}

fn phases(c: &mut Criterion) {
    let spec = spec(32, 4, 256);
    let costs = costs(&spec);
    let tt = generate(&spec);
    let low = lower(&tt).unwrap();
    let checked = Checked::new(low.clone()).unwrap();
    let mut group = c.benchmark_group("phases p=32 v=4 m=256");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    group.bench_function("generate", |b| b.iter(|| generate(black_box(&spec))));
    group.bench_function("lower", |b| b.iter(|| lower(black_box(&tt)).unwrap()));
    group.bench_function("validate", |b| {
        b.iter(|| validate(black_box(&low)).unwrap())
    });
    group.bench_function("simulate", |b| {
        b.iter(|| simulate(black_box(&checked), &costs).unwrap())
    });
    group.finish();
}

/// The search's targets: p=16, m=64 under a cap of 2p microbatches in under 10 s; p=32,
/// m=256 in under 60 s. Every candidate is generated, validated and simulated.
fn search_under_a_cap(c: &mut Criterion) {
    use pipewright::schedule::search::{search, MemoryCap, SearchSpec};
    let mut group = c.benchmark_group("search");
    for (p, m, secs) in [(16u32, 64u32, 5), (32, 256, 20)] {
        let costs = CostModel::uniform(p, StageCost::new(1.0, 2.0, Some(1.0)).unwrap());
        let spec = SearchSpec::new(p, m, costs, MemoryCap::Microbatches(f64::from(2 * p)));
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(secs));
        group.bench_function(format!("p={p} m={m} cap={}", 2 * p), |b| {
            b.iter(|| search(black_box(&spec)).unwrap().candidates.len())
        });
    }
    group.finish();
}

criterion_group!(benches, pipeline, phases, search_under_a_cap);
criterion_main!(benches);
