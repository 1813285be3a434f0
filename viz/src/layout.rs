//! Where everything of a bubble chart goes: a pure function of the panels and options, so
//! the SVG and PNG renderers (and tests) agree on every coordinate.

use pipewright_schedule::{ActionKind, MemorySample, Timeline};

use crate::canvas::MAX_SIDE;
use crate::lanes::{chunks_per_device, row_count};
use crate::style::{action_fill, kind_color, kind_name, Rgb};
use crate::text::text_width;
use crate::{ChartOptions, ChartPanel, VizError};

const MARGIN_L: f64 = 76.0;
const MARGIN_R: f64 = 62.0;
const TOP_PAD: f64 = 8.0;
const TITLE_H: f64 = 26.0;
pub(crate) const LEGEND_LINE_H: f64 = 18.0;
const LEGEND_GAP: f64 = 6.0;
const HEADER_H: f64 = 20.0;
const COMPUTE_H: f64 = 22.0;
const COMM_H: f64 = 7.0;
pub(crate) const COMM_GAP: f64 = 1.0;
const ROW_GAP: f64 = 5.0;
const MEM_HEADER_H: f64 = 18.0;
const MEM_H: f64 = 80.0;
const PANEL_GAP: f64 = 12.0;
const AXIS_H: f64 = 38.0;
/// Smallest compute lane we shrink to when a height is requested.
const MIN_COMPUTE_H: f64 = 4.0;
pub(crate) const LEGEND_FONT: f64 = 12.0;
const SWATCH: f64 = 13.0;

/// What the layout needs to know of one panel, computed once.
pub(crate) struct PanelData<'a> {
    pub tl: &'a Timeline,
    pub memory: Option<&'a [Vec<MemorySample>]>,
    pub label: String,
    pub rows: u32,
    pub chunks: u32,
    pub start: f64,
    pub span: f64,
    pub has_comm: bool,
}

impl<'a> PanelData<'a> {
    pub fn new(p: &ChartPanel<'a>) -> Result<Self, VizError> {
        let tl = p.timeline;
        if tl
            .events
            .iter()
            .any(|e| !e.start.is_finite() || !e.end.is_finite())
        {
            return Err(VizError::NonFiniteTime(tl.meta.schedule.clone()));
        }
        crate::drawable(tl)?;
        let start = if tl.events.is_empty() {
            0.0
        } else {
            tl.start()
        };
        Ok(PanelData {
            tl,
            memory: p.memory,
            label: p.label.clone().unwrap_or_else(|| default_label(tl)),
            rows: row_count(tl),
            chunks: chunks_per_device(tl),
            start,
            span: (tl.makespan() - start).max(0.0),
            has_comm: tl.events.iter().any(|e| e.action.kind.is_comm()),
        })
    }
}

/// `1f1b (v=1)` style label of a panel.
fn default_label(tl: &Timeline) -> String {
    format!("{} (v={})", tl.meta.schedule, chunks_per_device(tl))
}

/// One entry of the legend: swatches (several for chunk shading) and a label.
pub(crate) struct LegendItem {
    pub swatches: Vec<Rgb>,
    pub label: String,
    pub x: f64,
    pub y: f64,
}

/// Vertical sizes after stretching to a requested height.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Metrics {
    pub compute_h: f64,
    pub comm_h: f64,
    pub mem_h: f64,
}

/// Vertical positions of one panel.
pub(crate) struct PanelGeom {
    pub header_y: f64,
    pub rows_y: f64,
    pub row_pitch: f64,
    pub mem_y: Option<f64>,
}

/// Every coordinate of a bubble chart.
pub(crate) struct Layout {
    pub width: u32,
    pub height: u32,
    pub x0: f64,
    pub x1: f64,
    pub px_per_unit: f64,
    pub max_span: f64,
    pub title_y: f64,
    pub legend: Vec<LegendItem>,
    pub metrics: Metrics,
    pub panels: Vec<PanelGeom>,
    pub axis_y: f64,
}

impl Layout {
    pub fn new(panels: &[PanelData<'_>], opts: &ChartOptions) -> Result<Self, VizError> {
        let width = f64::from(opts.width);
        let min_width = (MARGIN_L + MARGIN_R + 120.0) as u32;
        let (x0, x1) = (MARGIN_L, width - MARGIN_R);
        let legend = legend_items(panels, 10.0, width - 10.0);
        let legend_h = legend.last().map_or(0.0, |l| l.y + LEGEND_LINE_H / 2.0) + LEGEND_GAP;
        let (fixed, variable) = vertical_budget(panels);
        let fixed = fixed + TOP_PAD + TITLE_H + legend_h;
        let natural = fixed + variable;
        let height = opts.height.map_or(natural, f64::from);
        let min_height = (fixed + variable * MIN_COMPUTE_H / COMPUTE_H).ceil();
        if opts.width < min_width || height < min_height {
            return Err(VizError::TooSmall {
                width: opts.width,
                height: height as u32,
                min_width,
                min_height: min_height as u32,
            });
        }
        check_max(opts.width, height)?;
        let k = if variable > 0.0 {
            (height - fixed) / variable
        } else {
            1.0
        };
        let metrics = Metrics {
            compute_h: COMPUTE_H * k,
            comm_h: COMM_H * k,
            mem_h: MEM_H * k,
        };
        let top = TOP_PAD + TITLE_H + legend_h;
        let (geoms, bottom) = place_panels(panels, &metrics, top);
        let max_span = panels.iter().map(|p| p.span).fold(0.0, f64::max);
        let px_per_unit = if max_span > 0.0 {
            (x1 - x0) / max_span
        } else {
            0.0
        };
        Ok(Layout {
            width: opts.width,
            height: height.round() as u32,
            x0,
            x1,
            px_per_unit,
            max_span,
            title_y: TOP_PAD + TITLE_H / 2.0,
            legend: shift_legend(legend, TOP_PAD + TITLE_H),
            metrics,
            panels: geoms,
            axis_y: bottom,
        })
    }
}

/// Size of a fixed-layout plot (sweep, Pareto): the options' width and height (or
/// `default_height`), refused below `min` or above what we allocate.
pub(crate) fn plot_size(
    opts: &crate::ChartOptions,
    default_height: u32,
    (min_width, min_height): (u32, u32),
) -> Result<(u32, u32), VizError> {
    let (width, height) = (opts.width, opts.height.unwrap_or(default_height));
    if width < min_width || height < min_height {
        return Err(VizError::TooSmall {
            width,
            height,
            min_width,
            min_height,
        });
    }
    check_max(width, f64::from(height))?;
    Ok((width, height))
}

/// Refuse images whose pixel buffer we would not want to allocate.
pub(crate) fn check_max(width: u32, height: f64) -> Result<(), VizError> {
    if width > MAX_SIDE || height > f64::from(MAX_SIDE) {
        return Err(VizError::TooLarge {
            width,
            height: height.min(f64::from(u32::MAX)) as u32,
            max: MAX_SIDE,
        });
    }
    Ok(())
}

/// Fixed and stretchable heights of the panels and axis (without title and legend).
fn vertical_budget(panels: &[PanelData<'_>]) -> (f64, f64) {
    let mut fixed = AXIS_H;
    let mut variable = 0.0;
    for (i, p) in panels.iter().enumerate() {
        let rows = f64::from(p.rows);
        fixed += HEADER_H + rows * ROW_GAP + if i > 0 { PANEL_GAP } else { 0.0 };
        let comm = if p.has_comm { COMM_H } else { 0.0 };
        fixed += if p.has_comm { rows * COMM_GAP } else { 0.0 };
        variable += rows * (COMPUTE_H + comm);
        if p.memory.is_some() {
            fixed += MEM_HEADER_H;
            variable += MEM_H;
        }
    }
    (fixed, variable)
}

/// Stack the panels from `top` down; returns their geometry and where the axis goes.
fn place_panels(panels: &[PanelData<'_>], m: &Metrics, top: f64) -> (Vec<PanelGeom>, f64) {
    let mut y = top;
    let mut out = Vec::with_capacity(panels.len());
    for (i, p) in panels.iter().enumerate() {
        if i > 0 {
            y += PANEL_GAP;
        }
        let header_y = y + HEADER_H / 2.0;
        y += HEADER_H;
        let comm = if p.has_comm { COMM_GAP + m.comm_h } else { 0.0 };
        let row_pitch = m.compute_h + comm + ROW_GAP;
        let rows_y = y;
        y += row_pitch * f64::from(p.rows);
        let mem_y = p.memory.map(|_| {
            y += MEM_HEADER_H;
            let at = y;
            y += m.mem_h;
            at
        });
        out.push(PanelGeom {
            header_y,
            rows_y,
            row_pitch,
            mem_y,
        });
    }
    (out, y)
}

/// Legend entries for what the panels contain, flowed into lines between `left` and `right`.
/// Positions are relative to the legend's top; [`shift_legend`] moves them into place.
fn legend_items(panels: &[PanelData<'_>], left: f64, right: f64) -> Vec<LegendItem> {
    let has = |k: ActionKind| {
        panels
            .iter()
            .any(|p| p.tl.events.iter().any(|e| e.action.kind == k))
    };
    let mut items: Vec<(Vec<Rgb>, String)> = Vec::new();
    for k in [
        ActionKind::F,
        ActionKind::B,
        ActionKind::I,
        ActionKind::W,
        ActionKind::R,
    ] {
        // F and B are always listed so an empty chart still explains its colours.
        if has(k) || matches!(k, ActionKind::F | ActionKind::B) {
            items.push((vec![kind_color(k)], format!("{k} {}", kind_name(k))));
        }
    }
    if panels.iter().any(|p| p.has_comm) {
        items.push((vec![kind_color(ActionKind::SendF)], "send".into()));
        items.push((vec![kind_color(ActionKind::RecvF)], "recv".into()));
    }
    items.push((vec![Rgb::WHITE], "idle".into()));
    let chunks = panels.iter().map(|p| p.chunks).max().unwrap_or(1);
    if chunks > 1 {
        let sw = (0..chunks.min(8))
            .map(|c| action_fill(ActionKind::F, c, chunks))
            .collect();
        items.push((
            sw,
            format!("chunk 0..{} (stage / p), lighter = later", chunks - 1),
        ));
    }
    flow(items, left, right)
}

/// Place legend items left to right, wrapping into new lines when `right` is reached.
fn flow(items: Vec<(Vec<Rgb>, String)>, left: f64, right: f64) -> Vec<LegendItem> {
    let mut out = Vec::with_capacity(items.len());
    let (mut x, mut y) = (left, LEGEND_LINE_H / 2.0);
    for (swatches, label) in items {
        let w = item_width(swatches.len(), &label);
        if x > left && x + w > right {
            x = left;
            y += LEGEND_LINE_H;
        }
        out.push(LegendItem {
            swatches,
            label,
            x,
            y,
        });
        x += w + 16.0;
    }
    center_lines(&mut out, left, right);
    out
}

/// Width of a legend item: its swatches, a gap, its label.
pub(crate) fn item_width(swatches: usize, label: &str) -> f64 {
    swatches as f64 * SWATCH + 5.0 + text_width(label, LEGEND_FONT, false)
}

/// Centre each legend line horizontally.
fn center_lines(items: &mut [LegendItem], left: f64, right: f64) {
    let mut i = 0;
    while i < items.len() {
        let y = items[i].y;
        let j = items[i..]
            .iter()
            .position(|it| it.y != y)
            .map_or(items.len(), |n| i + n);
        let last = &items[j - 1];
        let end = last.x + item_width(last.swatches.len(), &last.label);
        let shift = ((right - left) - (end - left)) / 2.0;
        for it in &mut items[i..j] {
            it.x += shift.max(0.0);
        }
        i = j;
    }
}

fn shift_legend(mut items: Vec<LegendItem>, top: f64) -> Vec<LegendItem> {
    for it in &mut items {
        it.y += top;
    }
    items
}

/// Side of one legend swatch.
pub(crate) const SWATCH_SIDE: f64 = SWATCH;
