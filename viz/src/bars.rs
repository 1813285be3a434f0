//! Measured memory per device as stacked horizontal bars, one segment per category of
//! [`MemoryBreakdown`], one group of bars per run on one shared byte scale (so runs compare
//! by length). Drawn alone ([`memory_bars`]) or under a bubble chart
//! ([`bubble_chart_with_memory`]).

use pipewright_model::memory::MemoryBreakdown;

use crate::canvas::{frame, Anchor, Canvas, TextSpec};
use crate::layout::{check_max, Layout, PanelData};
use crate::render::render;
use crate::style::{byte_ticks, format_bytes, Rgb};
use crate::text::text_width;
use crate::{ChartOptions, ChartPanel, ImageFormat, VizError};

/// One run's memory per device (index = device): each device's peak by category.
#[derive(Clone, Debug)]
pub struct MemoryBars<'a> {
    /// Heading of the group, e.g. `1f1b` or `1f1b, --recompute full`.
    pub label: String,
    /// Per device, the breakdown at its peak.
    pub devices: &'a [MemoryBreakdown],
}

const FONT: f64 = 11.0;
const HEAD_H: f64 = 22.0;
const KEY_H: f64 = 22.0;
const BAR_H: f64 = 16.0;
const BAR_GAP: f64 = 4.0;
const GROUP_GAP: f64 = 8.0;
const AXIS_H: f64 = 24.0;
const MARGIN_L: f64 = 76.0;
const MARGIN_R: f64 = 96.0;
const MIN_WIDTH: u32 = 400;

/// The categories in stacking order, with their names and colours.
const CATEGORIES: [(&str, Rgb); 6] = [
    ("parameters", Rgb(0x4e, 0x79, 0xa7)),
    ("gradients", Rgb(0xf2, 0x8e, 0x2b)),
    ("optimizer state", Rgb(0xe1, 0x57, 0x59)),
    ("activations", Rgb(0x59, 0xa1, 0x4f)),
    ("buffers", Rgb(0xb0, 0x7a, 0xa1)),
    ("workspace", Rgb(0x9c, 0x75, 0x5f)),
];

fn values(m: &MemoryBreakdown) -> [u64; 6] {
    [
        m.parameters,
        m.gradients,
        m.optimizer_state,
        m.activations,
        m.buffers,
        m.workspace,
    ]
}

/// Height the bars of `runs` take.
fn height(runs: &[MemoryBars<'_>]) -> f64 {
    let bars: usize = runs.iter().map(|r| r.devices.len()).sum();
    let groups = runs.len() as f64;
    KEY_H
        + groups * HEAD_H
        + bars as f64 * (BAR_H + BAR_GAP)
        + (groups - 1.0).max(0.0) * GROUP_GAP
        + AXIS_H
}

/// Draw the measured memory of `runs` as its own chart.
pub fn memory_bars(
    runs: &[MemoryBars<'_>],
    opts: &ChartOptions,
    fmt: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    if runs.is_empty() {
        return Err(VizError::NoPanels);
    }
    crate::text::ensure_fonts()?;
    let title_h = 30.0;
    let natural = (title_h + height(runs) + 8.0).ceil() as u32;
    let (w, h) = (opts.width, opts.height.unwrap_or(natural).max(natural));
    check_width(w, h)?;
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "measured memory per device".into());
    render(fmt, w, h, |c: &mut dyn Canvas| {
        let bold = TextSpec::new(15.0, Rgb::TEXT, Anchor::Middle).bold();
        c.text(f64::from(w) / 2.0, 16.0, &title, bold);
        draw_bars(c, runs, MARGIN_L, f64::from(w) - MARGIN_R, title_h);
    })
}

/// A bubble chart (as [`crate::bubble_chart`] draws it) with the measured memory of `runs`
/// under it, across the same width.
pub fn bubble_chart_with_memory(
    panels: &[ChartPanel<'_>],
    runs: &[MemoryBars<'_>],
    opts: &ChartOptions,
    fmt: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    if panels.is_empty() {
        return Err(VizError::NoPanels);
    }
    crate::text::ensure_fonts()?;
    let data = panels
        .iter()
        .map(PanelData::new)
        .collect::<Result<Vec<_>, _>>()?;
    let lay = Layout::new(&data, opts)?;
    let top = f64::from(lay.height);
    let h = (top + height(runs) + 8.0).ceil() as u32;
    check_width(lay.width, h)?;
    render(fmt, lay.width, h, |c: &mut dyn Canvas| {
        crate::bubble::draw_chart(c, &data, &lay, opts);
        draw_bars(c, runs, lay.x0, lay.x1, top);
    })
}

fn check_width(w: u32, h: u32) -> Result<(), VizError> {
    if w < MIN_WIDTH {
        return Err(VizError::TooSmall {
            width: w,
            height: h,
            min_width: MIN_WIDTH,
            min_height: h,
        });
    }
    check_max(w, f64::from(h))
}

/// The category key, then each run's heading and bars, then the byte axis, from `y` down
/// between `x0` and `x1`.
fn draw_bars(c: &mut dyn Canvas, runs: &[MemoryBars<'_>], x0: f64, x1: f64, y: f64) {
    draw_key(c, x0, y + KEY_H / 2.0);
    let max = runs
        .iter()
        .flat_map(|r| r.devices.iter().map(MemoryBreakdown::total))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let ticks = byte_ticks(max, 4);
    let scale_max = ticks.last().copied().filter(|&t| t >= max).unwrap_or(max);
    let to_x = |b: f64| x0 + b / scale_max * (x1 - x0);
    let body_top = y + KEY_H;
    let body_bottom = y + height(runs) - AXIS_H;
    // Grid first, so the bars sit on top of it.
    for t in &ticks {
        let x = to_x(*t);
        c.line(&[(x, body_top), (x, body_bottom)], Rgb::GRID, 1.0, false);
        let spec = TextSpec::new(FONT, Rgb::MUTED, Anchor::Middle);
        c.text(x, body_bottom + AXIS_H / 2.0, &format_bytes(*t), spec);
    }
    let mut at = body_top;
    for (g, run) in runs.iter().enumerate() {
        if g > 0 {
            at += GROUP_GAP;
        }
        let spec = TextSpec::new(FONT + 1.0, Rgb::TEXT, Anchor::Start).bold();
        c.text(x0 + 4.0, at + HEAD_H / 2.0, &run.label, spec);
        at += HEAD_H;
        for (d, m) in run.devices.iter().enumerate() {
            draw_bar(c, d, m, at, x0, &to_x);
            at += BAR_H + BAR_GAP;
        }
    }
    frame(c, x0, body_top, x1 - x0, body_bottom - body_top, Rgb::FRAME);
}

/// One device's bar: its label, the stacked categories, its total at the end.
fn draw_bar(
    c: &mut dyn Canvas,
    device: usize,
    m: &MemoryBreakdown,
    y: f64,
    x0: f64,
    to_x: &dyn Fn(f64) -> f64,
) {
    let mid = y + BAR_H / 2.0;
    let label = format!("dev {device}");
    c.text(
        x0 - 6.0,
        mid,
        &label,
        TextSpec::new(FONT, Rgb::TEXT, Anchor::End),
    );
    let mut sum = 0u64;
    for (v, (_, color)) in values(m).into_iter().zip(CATEGORIES) {
        let (a, b) = (to_x(sum as f64), to_x((sum + v) as f64));
        if b > a {
            c.rect(a, y, b - a, BAR_H, color);
        }
        sum += v;
    }
    let spec = TextSpec::new(FONT, Rgb::TEXT, Anchor::Start);
    c.text(to_x(sum as f64) + 5.0, mid, &format_bytes(sum as f64), spec);
}

/// "■ parameters ■ gradients …" on one line.
fn draw_key(c: &mut dyn Canvas, x0: f64, y: f64) {
    let mut x = x0;
    for (name, color) in CATEGORIES {
        c.rect(x, y - 5.0, 11.0, 11.0, color);
        c.text(
            x + 15.0,
            y,
            name,
            TextSpec::new(FONT, Rgb::TEXT, Anchor::Start),
        );
        x += 15.0 + text_width(name, FONT, false) + 14.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs() -> Vec<MemoryBreakdown> {
        vec![
            MemoryBreakdown {
                parameters: 4000,
                gradients: 4000,
                optimizer_state: 8000,
                activations: 30_000,
                buffers: 512,
                workspace: 0,
            },
            MemoryBreakdown {
                activations: 8000,
                ..Default::default()
            },
        ]
    }

    #[test]
    fn bars_name_every_device_and_category_with_totals() {
        let devices = runs();
        let r = [MemoryBars {
            label: "1f1b".into(),
            devices: &devices,
        }];
        let svg = memory_bars(&r, &ChartOptions::default(), ImageFormat::Svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        for s in [
            "dev 0",
            "dev 1",
            "1f1b",
            "optimizer state",
            "45.4 KiB",
            "7.8 KiB",
        ] {
            assert!(svg.contains(s), "{s}");
        }
        let png = memory_bars(&r, &ChartOptions::default(), ImageFormat::Png);
        #[cfg(feature = "png")]
        assert_eq!(&png.unwrap()[1..4], b"PNG");
        #[cfg(not(feature = "png"))]
        assert!(matches!(png, Err(VizError::PngNotBuilt)));
        assert!(matches!(
            memory_bars(&[], &ChartOptions::default(), ImageFormat::Svg),
            Err(VizError::NoPanels)
        ));
    }
}
