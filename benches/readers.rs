//! Timetable readers are linear in their input (issue 25, class 5): a CSV row of 1M actions
//! (one device, the case whose columns were once counted from the row start for every
//! cell, quadratic), 1M actions over 8 rows, the compute+comms form, and JSON, each at 250k
//! and 1M actions so that the ratio shows the growth (4x for linear). Figures in BENCHMARKS.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pipewright_schedule::{
    from_csv, generate, to_csv, write_csv, CsvForm, ScheduleKind, ScheduleSpec, Timetable,
};

/// A timetable of `actions` compute actions on `p` devices (1F1B: one F and one B per
/// stage and microbatch).
fn timetable(p: u32, actions: u32) -> Timetable {
    let m = actions / (2 * p);
    generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, p, 1, m, None).unwrap())
}

fn readers(c: &mut Criterion) {
    let mut group = c.benchmark_group("read timetable");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for actions in [250_000u32, 1_000_000] {
        group.throughput(Throughput::Elements(u64::from(actions)));
        let one_row = to_csv(&timetable(1, actions));
        group.bench_with_input(
            BenchmarkId::new("csv, one row", actions),
            &one_row,
            |b, t| b.iter(|| from_csv(black_box(t)).unwrap()),
        );
        let tt = timetable(8, actions);
        let rows = to_csv(&tt);
        group.bench_with_input(BenchmarkId::new("csv, 8 rows", actions), &rows, |b, t| {
            b.iter(|| from_csv(black_box(t)).unwrap())
        });
        let comms = write_csv(&tt, CsvForm::ComputeComms).unwrap();
        group.bench_with_input(
            BenchmarkId::new("csv compute+comms, 8 rows", actions),
            &comms,
            |b, t| b.iter(|| from_csv(black_box(t)).unwrap()),
        );
        let json = serde_json::to_string(&tt).unwrap();
        group.bench_with_input(BenchmarkId::new("json, 8 rows", actions), &json, |b, t| {
            b.iter(|| serde_json::from_str::<Timetable>(black_box(t)).unwrap())
        });
    }
    group.finish();
    let mut group = c.benchmark_group("write timetable");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    let tt = timetable(8, 1_000_000);
    group.throughput(Throughput::Elements(1_000_000));
    for (name, form) in [
        ("compute-only", CsvForm::ComputeOnly),
        ("compute+comms", CsvForm::ComputeComms),
    ] {
        group.bench_function(BenchmarkId::new(name, 1_000_000), |b| {
            b.iter(|| write_csv(black_box(&tt), form).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, readers);
criterion_main!(benches);
