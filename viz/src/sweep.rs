//! Sweep plot: bubble fraction, throughput and peak memory against the microbatch (chunk)
//! count, one line per schedule and v, on three side-by-side panels with a log2 x axis.

use crate::canvas::{frame, Anchor, Canvas, TextSpec};
use crate::layout::plot_size;
use crate::render::render;
use crate::style::{byte_ticks, format_bytes, format_number, nice_ticks, series_color, Rgb};
use crate::text::text_width;
use crate::{ChartOptions, ImageFormat, VizError};

/// One simulated (or measured) combination of a sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepPoint {
    /// Microbatch (chunk) count `m`; must be at least 1 to be drawn (log axis).
    pub microbatches: u32,
    /// Bubble fraction in `[0, 1]`.
    pub bubble_fraction: f64,
    /// Microbatches per time unit (`m / makespan`).
    pub throughput: f64,
    /// Peak stashed-activation bytes over all devices.
    pub peak_memory_bytes: u64,
}

/// One line of a sweep plot, e.g. `1f1b v=1`. Points need not be sorted; combinations that
/// could not run are simply absent (the caller lists them with their reason).
#[derive(Clone, Debug, PartialEq)]
pub struct SweepSeries {
    /// Legend label.
    pub label: String,
    /// The measured or simulated points.
    pub points: Vec<SweepPoint>,
}

const DEFAULT_HEIGHT: u32 = 400;
const MIN_W: u32 = 480;
const MIN_H: u32 = 220;
const TITLE_H: f64 = 30.0;
const LEGEND_H: f64 = 22.0;
const PAD_L: f64 = 62.0;
const PAD_R: f64 = 14.0;
const PAD_T: f64 = 24.0;
const PAD_B: f64 = 42.0;
const FONT: f64 = 11.0;

/// Draw a sweep plot: three panels (bubble fraction, throughput, peak memory) against the
/// microbatch count, one line per series. `opts.memory_cap` draws a dashed cap line.
pub fn sweep_plot(
    series: &[SweepSeries],
    opts: &ChartOptions,
    fmt: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    let (w, h) = plot_size(opts, DEFAULT_HEIGHT, (MIN_W, MIN_H))?;
    let clean: Vec<Vec<SweepPoint>> = series.iter().map(|s| usable(&s.points)).collect();
    let draw = |c: &mut dyn Canvas| draw_sweep(c, series, &clean, opts, (w, h));
    render(fmt, w, h, draw)
}

/// Points that can be drawn (m >= 1, finite values), sorted by m.
fn usable(points: &[SweepPoint]) -> Vec<SweepPoint> {
    let mut v: Vec<SweepPoint> = points
        .iter()
        .filter(|p| {
            p.microbatches >= 1 && p.bubble_fraction.is_finite() && p.throughput.is_finite()
        })
        .copied()
        .collect();
    v.sort_by_key(|p| p.microbatches);
    v
}

/// What one panel plots.
struct Metric {
    title: &'static str,
    bytes: bool,
    value: fn(&SweepPoint) -> f64,
    label: fn(f64) -> String,
}

const METRICS: [Metric; 3] = [
    Metric {
        title: "bubble fraction",
        bytes: false,
        value: |p| p.bubble_fraction,
        label: |v| format!("{}%", format_number((v * 100.0 * 10.0).round() / 10.0)),
    },
    Metric {
        title: "throughput (microbatches / time unit)",
        bytes: false,
        value: |p| p.throughput,
        label: format_number,
    },
    Metric {
        title: "peak activation memory",
        bytes: true,
        value: |p| p.peak_memory_bytes as f64,
        label: format_bytes,
    },
];

fn draw_sweep(
    c: &mut dyn Canvas,
    series: &[SweepSeries],
    clean: &[Vec<SweepPoint>],
    opts: &ChartOptions,
    (w, h): (u32, u32),
) {
    let (w, h) = (f64::from(w), f64::from(h));
    let title = opts
        .title
        .as_deref()
        .unwrap_or("microbatch (chunk) count sweep");
    c.text(
        w / 2.0,
        TITLE_H / 2.0 + 4.0,
        title,
        TextSpec::new(15.0, Rgb::TEXT, Anchor::Middle).bold(),
    );
    draw_series_legend(c, series, w, TITLE_H + LEGEND_H / 2.0);
    let xr = x_range(clean);
    let top = TITLE_H + LEGEND_H + 4.0;
    let pw = w / 3.0;
    for (i, m) in METRICS.iter().enumerate() {
        let cap = if i == 2 { opts.memory_cap } else { None };
        let area = Area {
            x0: pw * i as f64 + PAD_L,
            x1: pw * (i + 1) as f64 - PAD_R,
            y0: top + PAD_T,
            y1: h - PAD_B,
        };
        draw_panel(c, m, clean, &area, xr, cap);
    }
}

/// Series swatches and labels on one centred line.
fn draw_series_legend(c: &mut dyn Canvas, series: &[SweepSeries], w: f64, y: f64) {
    let widths: Vec<f64> = series
        .iter()
        .map(|s| 26.0 + text_width(&s.label, 12.0, false))
        .collect();
    let total: f64 = widths.iter().sum::<f64>() + 14.0 * series.len().saturating_sub(1) as f64;
    let mut x = ((w - total) / 2.0).max(8.0);
    for (i, (s, sw)) in series.iter().zip(&widths).enumerate() {
        let col = series_color(i);
        c.line(
            &[(x, y), (x + 18.0, y)],
            col,
            line_width(i, series.len()),
            false,
        );
        c.rect(x + 6.5, y - 2.5, 5.0, 5.0, col);
        c.text(
            x + 24.0,
            y,
            &s.label,
            TextSpec::new(12.0, Rgb::TEXT, Anchor::Start),
        );
        x += sw + 14.0;
    }
}

/// Earlier series are drawn wider, so a line that coincides with a later one (1f1b and
/// gpipe have the same bubble) still shows around it.
fn line_width(i: usize, n: usize) -> f64 {
    let rank = n.saturating_sub(1).saturating_sub(i) as f64;
    1.75 + 1.5 * rank.min(3.0)
}

/// log2 range of all points' m, padded; `(0, 1)`-ish when there is nothing.
fn x_range(clean: &[Vec<SweepPoint>]) -> (f64, f64) {
    let ms = clean
        .iter()
        .flatten()
        .map(|p| f64::from(p.microbatches).log2());
    let (lo, hi) = ms.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    if !lo.is_finite() {
        return (0.0, 3.0);
    }
    if hi - lo < 1e-9 {
        return (lo - 1.0, hi + 1.0);
    }
    let pad = 0.08 * (hi - lo);
    (lo - pad, hi + pad)
}

/// A panel's plotting rectangle.
struct Area {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

fn draw_panel(
    c: &mut dyn Canvas,
    m: &Metric,
    clean: &[Vec<SweepPoint>],
    a: &Area,
    (lo, hi): (f64, f64),
    cap: Option<u64>,
) {
    let title = TextSpec::new(12.0, Rgb::TEXT, Anchor::Middle).bold();
    c.text((a.x0 + a.x1) / 2.0, a.y0 - PAD_T / 2.0, m.title, title);
    let vmax = clean
        .iter()
        .flatten()
        .map(m.value)
        .chain(cap.map(|c| c as f64))
        .fold(0.0, f64::max);
    let ymax = if vmax > 0.0 { vmax * 1.1 } else { 1.0 };
    let to_x = |l: f64| a.x0 + (l - lo) / (hi - lo) * (a.x1 - a.x0);
    let to_y = |v: f64| a.y1 - v / ymax * (a.y1 - a.y0);
    let ticks = if m.bytes {
        byte_ticks(ymax, 5)
    } else {
        nice_ticks(0.0, ymax, 5)
    };
    for t in ticks {
        c.line(&[(a.x0, to_y(t)), (a.x1, to_y(t))], Rgb::GRID, 1.0, false);
        c.text(
            a.x0 - 6.0,
            to_y(t),
            &(m.label)(t),
            TextSpec::new(FONT - 1.0, Rgb::TEXT, Anchor::End),
        );
    }
    draw_x_axis(c, a, (lo, hi), &to_x);
    frame(c, a.x0, a.y0, a.x1 - a.x0, a.y1 - a.y0, Rgb::FRAME);
    if let Some(cap) = cap {
        let y = to_y(cap as f64);
        c.line(&[(a.x0, y), (a.x1, y)], Rgb::CAP, 1.0, true);
        let spec = TextSpec::new(FONT - 1.0, Rgb::CAP, Anchor::End);
        c.text(
            a.x1 - 4.0,
            y - 8.0,
            &format!("cap {}", format_bytes(cap as f64)),
            spec,
        );
    }
    for (i, pts) in clean.iter().enumerate() {
        let xy: Vec<(f64, f64)> = pts
            .iter()
            .map(|p| (to_x(f64::from(p.microbatches).log2()), to_y((m.value)(p))))
            .collect();
        c.line(&xy, series_color(i), line_width(i, clean.len()), false);
        for (x, y) in &xy {
            c.rect(x - 2.5, y - 2.5, 5.0, 5.0, series_color(i));
        }
    }
    if clean.iter().all(Vec::is_empty) {
        let spec = TextSpec::new(FONT, Rgb::MUTED, Anchor::Middle);
        c.text((a.x0 + a.x1) / 2.0, (a.y0 + a.y1) / 2.0, "no data", spec);
    }
}

/// Ticks at powers of two (every other one when crowded), labelled with m itself.
fn draw_x_axis(c: &mut dyn Canvas, a: &Area, (lo, hi): (f64, f64), to_x: &dyn Fn(f64) -> f64) {
    let first = lo.ceil() as i32;
    let last = hi.floor() as i32;
    let room = ((a.x1 - a.x0) / 34.0).max(1.0) as i32;
    let step = ((last - first + 1) / room + 1).max(1);
    for k in (first..=last).step_by(step as usize) {
        let x = to_x(f64::from(k));
        c.line(&[(x, a.y1), (x, a.y1 + 4.0)], Rgb::MUTED, 1.0, false);
        let label = format_number(2f64.powi(k));
        c.text(
            x,
            a.y1 + 13.0,
            &label,
            TextSpec::new(FONT - 1.0, Rgb::TEXT, Anchor::Middle),
        );
    }
    let spec = TextSpec::new(FONT, Rgb::MUTED, Anchor::Middle);
    c.text(
        (a.x0 + a.x1) / 2.0,
        a.y1 + 29.0,
        "microbatches m (log2 scale)",
        spec,
    );
}
