//! Chart rendering speed: a 100,000-compute-action timeline to SVG (target: under 2 s) and
//! to PNG, and the terminal chart of the same timeline.
//!
//! `cargo bench --bench viz -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, Criterion};
use pipewright_viz::{bubble_chart, terminal_chart, ChartOptions, ChartPanel, ImageFormat};

#[path = "../viz/tests/it/common/mod.rs"]
mod common;

fn charts(c: &mut Criterion) {
    // 1F1B on 8 devices with 6,250 microbatches: 8 * 6,250 * 2 = 100,000 compute actions,
    // plus 87,500 sends and receives each on the comm lanes.
    let tl = common::timeline("1f1b", 8, 1, 6_250, true);
    assert_eq!(tl.compute_events().count(), 100_000);
    let mem = common::memory(&tl);
    let opts = ChartOptions::default();
    let mut g = c.benchmark_group("viz");
    g.sample_size(10);
    g.bench_function("svg_100k_compute_actions", |b| {
        b.iter(|| bubble_chart(&[ChartPanel::new(&tl)], &opts, ImageFormat::Svg).unwrap())
    });
    g.bench_function("svg_100k_with_memory", |b| {
        let panel = ChartPanel::new(&tl).with_memory(&mem);
        b.iter(|| bubble_chart(std::slice::from_ref(&panel), &opts, ImageFormat::Svg).unwrap())
    });
    g.bench_function("png_100k_compute_actions", |b| {
        b.iter(|| bubble_chart(&[ChartPanel::new(&tl)], &opts, ImageFormat::Png).unwrap())
    });
    g.bench_function("term_100k_compute_actions", |b| {
        b.iter(|| terminal_chart(&tl, 100))
    });
    g.finish();
}

criterion_group!(benches, charts);
criterion_main!(benches);
