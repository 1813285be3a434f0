//! What the charts must show: one identifiable box per compute action at true scale, images
//! that decode at the requested size, terminal lines that fit, and no panics on odd input.
use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use pipewright_schedule::{Timeline, TimelineMeta, TimelineSource};
use pipewright_viz::{
    bubble_chart, sweep_plot, terminal_chart, ChartOptions, ChartPanel, ImageFormat, SweepPoint,
    SweepSeries, VizError,
};

/// One `<rect class="act …">` of the SVG: its attributes by name.
fn action_rects(svg: &str) -> Vec<BTreeMap<String, String>> {
    svg.lines()
        .filter(|l| l.starts_with("<rect class=\"act "))
        .map(|l| {
            let head = &l[..l.find('>').unwrap()];
            let mut attrs = BTreeMap::new();
            for part in head.split("\" ") {
                if let Some((k, v)) = part.split_once("=\"") {
                    let k = k.rsplit(' ').next().unwrap();
                    attrs.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
            }
            attrs
        })
        .collect()
}

fn num(a: &BTreeMap<String, String>, k: &str) -> f64 {
    a[k].parse().unwrap()
}

fn svg_of(panels: &[ChartPanel<'_>], opts: &ChartOptions) -> String {
    String::from_utf8(bubble_chart(panels, opts, ImageFormat::Svg).unwrap()).unwrap()
}

#[test]
fn svg_has_one_box_per_compute_action_at_true_scale() {
    let tl = common::timeline("interleaved-1f1b", 4, 2, 8, true);
    // S * m = 8 * 8 = 64 (stage, microbatch) pairs, each with one F and one B: 128 actions.
    // (Issue 3 says "64": that counts pairs, not actions.)
    assert_eq!(tl.compute_events().count(), 128);
    let svg = svg_of(&[ChartPanel::new(&tl)], &ChartOptions::default());
    let rects = action_rects(&svg);
    let compute: Vec<_> = rects
        .iter()
        .filter(|a| ["act F", "act B"].contains(&a["class"].as_str()))
        .collect();
    assert_eq!(compute.len(), 128);
    let mut want: Vec<(u32, u32, String, u32)> = tl
        .compute_events()
        .map(|e| {
            (
                e.device,
                e.action.stage,
                e.action.kind.to_string(),
                e.action.microbatch,
            )
        })
        .collect();
    let mut got: Vec<(u32, u32, String, u32)> = compute
        .iter()
        .map(|a| {
            let kind = a["class"].trim_start_matches("act ").to_string();
            (
                num(a, "data-device") as u32,
                num(a, "data-stage") as u32,
                kind,
                num(a, "data-mb") as u32,
            )
        })
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    assert!(compute.iter().all(|a| a["data-count"] == "1"));
    // Widths proportional to durations: F is half a B here, and every ratio is the same.
    let ratios: Vec<f64> = compute
        .iter()
        .map(|a| {
            let dur = if a["class"] == "act F" { 0.5 } else { 1.0 };
            num(a, "width") / dur
        })
        .collect();
    let r0 = ratios[0];
    assert!(
        ratios.iter().all(|r| (r - r0).abs() / r0 < 1e-4),
        "{ratios:?}"
    );
    // And positions follow start times on the same scale.
    let x0 = compute
        .iter()
        .map(|a| num(a, "x"))
        .fold(f64::INFINITY, f64::min);
    for e in tl.compute_events() {
        let id = (
            e.device.to_string(),
            e.action.stage.to_string(),
            e.action.microbatch.to_string(),
        );
        let a = compute
            .iter()
            .find(|a| {
                a["class"] == format!("act {}", e.action.kind)
                    && (
                        a["data-device"].clone(),
                        a["data-stage"].clone(),
                        a["data-mb"].clone(),
                    ) == id
            })
            .unwrap();
        // 4-decimal widths give r0 to ~1e-4, so allow 0.01 px over the whole chart.
        assert!(
            (num(a, "x") - x0 - e.start * r0).abs() < 1e-2,
            "{a:?} {e:?} x0={x0} r0={r0}"
        );
    }
    let first = compute
        .iter()
        .map(|a| num(a, "x"))
        .fold(f64::INFINITY, f64::min);
    let last_end = compute
        .iter()
        .map(|a| num(a, "x") + num(a, "width"))
        .fold(0.0, f64::max);
    assert!(((last_end - first) / r0 - tl.makespan()).abs() < 1e-3);
    // Comm events are drawn too, on their own lane.
    assert_eq!(rects.len(), tl.events.len());
    assert!(
        svg.contains("<title>dev 0 0F0 [0, 0.5]</title>"),
        "tooltips name the action"
    );
}

#[test]
fn comparison_shares_one_time_scale() {
    let g = common::timeline("gpipe", 4, 1, 8, false);
    let i = common::timeline("interleaved-1f1b", 4, 2, 8, false);
    let svg = svg_of(
        &[ChartPanel::new(&g), ChartPanel::new(&i)],
        &ChartOptions::default(),
    );
    let rects = action_rects(&svg);
    let extent = |p: &str| {
        let r: Vec<_> = rects.iter().filter(|a| a["data-panel"] == p).collect();
        let lo = r.iter().map(|a| num(a, "x")).fold(f64::INFINITY, f64::min);
        let hi = r
            .iter()
            .map(|a| num(a, "x") + num(a, "width"))
            .fold(0.0, f64::max);
        (lo, hi - lo)
    };
    let ((g0, gw), (i0, iw)) = (extent("0"), extent("1"));
    assert!((g0 - i0).abs() < 1e-6, "panels start at the same x");
    let want = i.makespan() / g.makespan();
    assert!((iw / gw - want).abs() < 1e-4, "{} vs {want}", iw / gw);
    assert!(svg.contains("gpipe (v=1) vs interleaved-1f1b (v=2) · p=4 m=8"));
}

/// Decode a PNG: (width, height, RGB bytes).
fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut r = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn non_white(rgb: &[u8]) -> usize {
    rgb.chunks(3).filter(|p| p != &[255, 255, 255]).count()
}

#[test]
fn png_decodes_at_the_requested_size_and_is_not_blank() {
    let tl = common::timeline("1f1b-iw", 4, 1, 8, true);
    let mem = common::memory(&tl);
    let opts = ChartOptions {
        width: 900,
        height: Some(520),
        ..Default::default()
    };
    let panel = ChartPanel::new(&tl).with_memory(&mem);
    let (w, h, rgb) = decode(&bubble_chart(&[panel], &opts, ImageFormat::Png).unwrap());
    assert_eq!((w, h), (900, 520));
    let inked = non_white(&rgb);
    assert!(
        inked > (w * h / 10) as usize,
        "only {inked} non-background pixels"
    );
    // The F colour is present (boxes drawn, not only text and frames).
    assert!(rgb.chunks(3).any(|p| p == [0x4e, 0x79, 0xa7]));
}

#[test]
fn png_without_height_picks_one_that_fits() {
    let tl = common::timeline("1f1b", 2, 1, 4, false);
    let (w, h, rgb) = decode(
        &bubble_chart(
            &[ChartPanel::new(&tl)],
            &ChartOptions::default(),
            ImageFormat::Png,
        )
        .unwrap(),
    );
    assert_eq!(w, 1200);
    assert!((150..400).contains(&h), "{h}");
    assert!(non_white(&rgb) > 1000);
}

#[test]
fn terminal_lines_fit_their_columns() {
    let tl = common::timeline("interleaved-1f1b", 4, 2, 8, true);
    for cols in [100, 80, 40, 24, 5] {
        let text = terminal_chart(&tl, cols);
        let limit = cols.max(pipewright_viz::MIN_TERM_COLUMNS);
        for line in text.lines() {
            assert!(line.chars().count() <= limit, "{cols}: `{line}`");
        }
        assert_eq!(text.lines().filter(|l| l.starts_with("dev ")).count(), 4);
    }
    let text = terminal_chart(&tl, 100);
    assert!(text
        .lines()
        .any(|l| l.starts_with("dev 0|F") && l.ends_with('%')));
    assert!(text.contains("F forward"));
}

fn empty(devices: u32) -> Timeline {
    Timeline {
        meta: TimelineMeta {
            schedule: "empty".into(),
            devices,
            stages: devices,
            microbatches: 0,
            source: TimelineSource::Measured,
            time_unit: "ms".into(),
        },
        events: vec![],
    }
}

#[test]
fn empty_timelines_draw_without_panicking() {
    for d in [0, 3] {
        let tl = empty(d);
        let mem: Vec<Vec<pipewright_schedule::MemorySample>> = vec![Vec::new(); d as usize];
        let panel = ChartPanel::new(&tl).with_memory(&mem);
        for fmt in [ImageFormat::Svg, ImageFormat::Png] {
            assert!(
                !bubble_chart(std::slice::from_ref(&panel), &ChartOptions::default(), fmt)
                    .unwrap()
                    .is_empty()
            );
        }
        assert!(terminal_chart(&tl, 60).contains("bubble 0.0%"));
    }
    assert!(matches!(
        bubble_chart(&[], &ChartOptions::default(), ImageFormat::Svg),
        Err(VizError::NoPanels)
    ));
}

#[test]
fn bad_input_gives_one_line_errors() {
    let e = ImageFormat::from_path(Path::new("out/chart.jpeg")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot tell the image format of `out/chart.jpeg`: use a .svg or .png file name"
    );
    assert!(ImageFormat::from_path(Path::new("noext")).is_err());
    assert_eq!(
        ImageFormat::from_path(Path::new("A.SVG")).unwrap(),
        ImageFormat::Svg
    );

    let tl = common::timeline("1f1b", 4, 1, 8, false);
    let tiny = ChartOptions {
        width: 1200,
        height: Some(60),
        ..Default::default()
    };
    let e = bubble_chart(&[ChartPanel::new(&tl)], &tiny, ImageFormat::Png).unwrap_err();
    assert!(matches!(e, VizError::TooSmall { .. }), "{e}");
    assert!(!e.to_string().contains('\n'));
    let huge = ChartOptions {
        width: 100_000,
        ..Default::default()
    };
    assert!(matches!(
        bubble_chart(&[ChartPanel::new(&tl)], &huge, ImageFormat::Png),
        Err(VizError::TooLarge { .. })
    ));

    let mut nan = tl.clone();
    nan.events[3].end = f64::NAN;
    let e = bubble_chart(
        &[ChartPanel::new(&nan)],
        &ChartOptions::default(),
        ImageFormat::Svg,
    )
    .unwrap_err();
    assert!(matches!(e, VizError::NonFiniteTime(_)));

    // Zero costs: every box zero wide would read as an idle step, so it is refused.
    let mut flat = tl.clone();
    for ev in &mut flat.events {
        (ev.start, ev.end) = (0.0, 0.0);
    }
    let e = bubble_chart(
        &[ChartPanel::new(&flat)],
        &ChartOptions::default(),
        ImageFormat::Svg,
    )
    .unwrap_err();
    assert!(matches!(e, VizError::ZeroSpan(_)), "{e}");
    assert!(e.to_string().contains("takes no time"), "{e}");
}

#[test]
fn large_timelines_merge_thin_boxes_but_lose_none() {
    let tl = common::timeline("1f1b", 8, 1, 1250, false);
    let n = tl.compute_events().count();
    assert_eq!(n, 20_000);
    let opts = ChartOptions {
        width: 800,
        ..Default::default()
    };
    let svg = svg_of(&[ChartPanel::new(&tl)], &opts);
    let rects = action_rects(&svg);
    let total: f64 = rects.iter().map(|a| num(a, "data-count")).sum();
    assert_eq!(total as usize, n, "every action is in exactly one box");
    assert!(rects.len() < n, "some thin boxes were merged");
    // Nothing is drawn outside the time span.
    let (lo, hi) = (76.0, 800.0 - 62.0);
    assert!(rects
        .iter()
        .all(|a| num(a, "x") >= lo - 1e-6 && num(a, "x") + num(a, "width") <= hi + 1e-3));
}

#[test]
fn memory_panel_and_cap_are_drawn() {
    let tl = common::timeline("gpipe", 4, 1, 8, false);
    let mem = common::memory(&tl);
    let opts = ChartOptions {
        memory_cap: Some(6 << 20),
        ..Default::default()
    };
    let svg = svg_of(&[ChartPanel::new(&tl).with_memory(&mem)], &opts);
    assert!(svg.contains("activation memory per device"));
    assert!(svg.contains("stroke-dasharray"), "cap line");
    assert!(
        svg.matches("<polyline").count() >= 4,
        "a step line per device"
    );
}

fn sweep_series() -> Vec<SweepSeries> {
    ["gpipe", "1f1b"]
        .iter()
        .map(|name| SweepSeries {
            label: format!("{name} v=1"),
            points: [4u32, 8, 16, 32]
                .iter()
                .map(|&m| SweepPoint {
                    microbatches: m,
                    bubble_fraction: 3.0 / f64::from(m + 3),
                    throughput: f64::from(m) / f64::from(3 * (m + 3)),
                    peak_memory_bytes: u64::from(m) << 20,
                })
                .collect(),
        })
        .collect()
}

#[test]
fn sweep_plot_draws_every_series_in_both_formats() {
    let series = sweep_series();
    let opts = ChartOptions {
        width: 1000,
        height: Some(360),
        memory_cap: Some(20 << 20),
        ..Default::default()
    };
    let svg = String::from_utf8(sweep_plot(&series, &opts, ImageFormat::Svg).unwrap()).unwrap();
    for needle in [
        "gpipe v=1",
        "1f1b v=1",
        "bubble fraction",
        "peak activation memory",
        "cap 20.0 MiB",
        ">16<",
    ] {
        assert!(svg.contains(needle), "missing {needle}");
    }
    let (w, h, rgb) = decode(&sweep_plot(&series, &opts, ImageFormat::Png).unwrap());
    assert_eq!((w, h), (1000, 360));
    assert!(non_white(&rgb) > 5000);
    // Odd input: no series, a point with m = 0, a NaN.
    let mut odd = sweep_series();
    odd[0].points[0].microbatches = 0;
    odd[1].points[1].bubble_fraction = f64::NAN;
    assert!(sweep_plot(&odd, &opts, ImageFormat::Png).is_ok());
    assert!(sweep_plot(&[], &opts, ImageFormat::Svg).is_ok());
}
