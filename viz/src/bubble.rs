//! Drawing a bubble chart (one or several timelines on a shared time axis) on a [`Canvas`].

use pipewright_schedule::{Timeline, TimelineSource};

use crate::canvas::{frame, Anchor, BoxTag, Canvas, TextSpec};
use crate::dense::split_dense;
use crate::lanes::{lane_boxes, split_lanes, LaneBox, TimeScale};
use crate::layout::{Layout, PanelData, PanelGeom, COMM_GAP, LEGEND_FONT, SWATCH_SIDE};
use crate::memory;
use crate::style::{format_number, nice_ticks, Rgb};
use crate::text::{fit_width, text_width};
use crate::ChartOptions;

const LABEL_FONT: f64 = 11.0;
const HEADER_FONT: f64 = 12.0;
const TITLE_FONT: f64 = 15.0;
const COMM_LANE_BG: Rgb = Rgb(243, 243, 243);

/// Draw the whole chart.
pub(crate) fn draw_chart(
    c: &mut dyn Canvas,
    panels: &[PanelData<'_>],
    lay: &Layout,
    opts: &ChartOptions,
) {
    let title = opts.title.clone().unwrap_or_else(|| default_title(panels));
    let spec = TextSpec::new(TITLE_FONT, Rgb::TEXT, Anchor::Middle).bold();
    let title = fit_width(&title, TITLE_FONT, true, f64::from(lay.width) - 16.0);
    c.text(f64::from(lay.width) / 2.0, lay.title_y, &title, spec);
    draw_legend(c, lay);
    let mem_scale = memory::shared_scale(panels, opts.memory_cap);
    for (i, (p, g)) in panels.iter().zip(&lay.panels).enumerate() {
        draw_header(c, p, g, lay);
        draw_rows(c, i, p, g, lay);
        if let (Some(mem), Some(y)) = (p.memory, g.mem_y) {
            let area = memory::MemArea {
                y,
                h: lay.metrics.mem_h,
                scale: mem_scale,
            };
            memory::draw_memory(c, mem, p, lay, &area, opts.memory_cap);
        }
    }
    draw_axis(c, panels, lay);
}

/// `p=4 v=2 m=8` of a timeline.
pub(crate) fn params(tl: &Timeline) -> String {
    let m = &tl.meta;
    let v = crate::lanes::chunks_per_device(tl);
    format!("p={} v={} m={}", m.devices, v, m.microbatches)
}

fn source_name(s: TimelineSource) -> &'static str {
    match s {
        TimelineSource::Simulated => "simulated",
        TimelineSource::Measured => "measured",
    }
}

/// Title from the timelines: schedule and parameters, or the schedules compared and what
/// they have in common.
fn default_title(panels: &[PanelData<'_>]) -> String {
    let Some(first) = panels.first() else {
        return String::new();
    };
    let m = &first.tl.meta;
    if panels.len() == 1 {
        return format!(
            "{} · {} · {}",
            m.schedule,
            params(first.tl),
            source_name(m.source)
        );
    }
    let names: Vec<&str> = panels.iter().map(|p| p.label.as_str()).collect();
    let mut t = names.join(" vs ");
    let same = |f: &dyn Fn(&Timeline) -> u32| panels.iter().all(|p| f(p.tl) == f(first.tl));
    if same(&|t| t.meta.devices) && same(&|t| t.meta.microbatches) {
        t.push_str(&format!(" · p={} m={}", m.devices, m.microbatches));
    }
    if panels.iter().all(|p| p.tl.meta.source == m.source) {
        t.push_str(&format!(" · {}", source_name(m.source)));
    }
    t
}

fn draw_legend(c: &mut dyn Canvas, lay: &Layout) {
    for it in &lay.legend {
        let top = it.y - SWATCH_SIDE / 2.0;
        for (i, col) in it.swatches.iter().enumerate() {
            let x = it.x + i as f64 * SWATCH_SIDE;
            c.rect(x, top, SWATCH_SIDE, SWATCH_SIDE, *col);
        }
        let w = it.swatches.len() as f64 * SWATCH_SIDE;
        frame(c, it.x, top, w, SWATCH_SIDE, Rgb::FRAME);
        let spec = TextSpec::new(LEGEND_FONT, Rgb::TEXT, Anchor::Start);
        c.text(it.x + w + 5.0, it.y, &it.label, spec);
    }
}

/// Panel header: its label in bold, then parameters, makespan and bubble.
fn draw_header(c: &mut dyn Canvas, p: &PanelData<'_>, g: &PanelGeom, lay: &Layout) {
    let bold = TextSpec::new(HEADER_FONT, Rgb::TEXT, Anchor::Start).bold();
    let room = lay.x1 - lay.x0 - 8.0;
    let label = fit_width(&p.label, HEADER_FONT, true, room);
    c.text(lay.x0, g.header_y, &label, bold);
    let x = lay.x0 + text_width(&label, HEADER_FONT, true) + 10.0;
    let run = format!(
        "makespan {} {} · bubble {:.1}%",
        format_number(p.span),
        p.tl.meta.time_unit,
        100.0 * p.tl.bubble_fraction()
    );
    let full = format!(
        "{} · {} · {run}",
        params(p.tl),
        source_name(p.tl.meta.source)
    );
    // Narrow charts drop the parameters (the title has them) before cutting text.
    let room = lay.x1 - 8.0 - x;
    let stats = if text_width(&full, HEADER_FONT, false) <= room {
        full
    } else {
        fit_width(&run, HEADER_FONT, false, room)
    };
    c.text(
        x,
        g.header_y,
        &stats,
        TextSpec::new(HEADER_FONT, Rgb::MUTED, Anchor::Start),
    );
    let head = TextSpec::new(LABEL_FONT - 1.0, Rgb::MUTED, Anchor::Start);
    c.text(lay.x1 + 8.0, g.header_y, "bubble", head);
}

/// Device rows: label, lane frames, compute and comm boxes, bubble percentage.
fn draw_rows(c: &mut dyn Canvas, panel: usize, p: &PanelData<'_>, g: &PanelGeom, lay: &Layout) {
    let m = lay.metrics;
    let scale = TimeScale {
        t0: p.start,
        x0: lay.x0,
        px_per_unit: lay.px_per_unit,
    };
    let end_x = scale.x(p.start + p.span);
    let bubbles = p.tl.bubble_per_device();
    let lanes = split_lanes(p.tl, p.rows);
    for (d, lane) in lanes.iter().enumerate() {
        let y = g.rows_y + g.row_pitch * d as f64;
        let mid = y + m.compute_h / 2.0;
        let label = TextSpec::new(LABEL_FONT, Rgb::TEXT, Anchor::End);
        c.text(lay.x0 - 8.0, mid, &format!("dev {d}"), label);
        // The frame marks the step's extent, so idle time reads as white space inside it.
        frame(c, lay.x0, y, end_x - lay.x0, m.compute_h, Rgb::FRAME);
        let boxes = lane_boxes(&lane.compute, &scale, p.tl.meta.devices, p.chunks);
        draw_lane(c, panel, boxes, y, m.compute_h, true);
        if p.has_comm {
            let cy = y + m.compute_h + COMM_GAP;
            c.rect(lay.x0, cy, end_x - lay.x0, m.comm_h, COMM_LANE_BG);
            let boxes = lane_boxes(&lane.comm, &scale, p.tl.meta.devices, p.chunks);
            draw_lane(c, panel, boxes, cy, m.comm_h, false);
        }
        let pct = bubbles
            .get(d)
            .map_or(String::new(), |b| format!("{:.1}%", 100.0 * b));
        c.text(
            lay.x1 + 8.0,
            mid,
            &pct,
            TextSpec::new(LABEL_FONT, Rgb::TEXT, Anchor::Start),
        );
    }
}

/// One lane: boxes a pixel wide or more one by one, thinner ones as dense columns.
fn draw_lane(c: &mut dyn Canvas, panel: usize, boxes: Vec<LaneBox>, y: f64, h: f64, numbers: bool) {
    let (wide, dense) = split_dense(boxes);
    draw_boxes(c, panel, &wide, y, h, numbers);
    for run in dense {
        // Stacked from the lane's bottom; what is left above is idle (white).
        let mut top = y + h;
        for piece in &run.pieces {
            let ph = piece.share * h;
            top -= ph;
            c.action_box(
                run.x,
                top,
                run.w,
                ph,
                piece.fill,
                &BoxTag { panel, ..piece.tag },
            );
        }
    }
}

/// Boxes of one lane, with microbatch numbers where they fit.
fn draw_boxes(c: &mut dyn Canvas, panel: usize, boxes: &[LaneBox], y: f64, h: f64, numbers: bool) {
    let size = (h * 0.62).min(LABEL_FONT);
    // DejaVu digits share one advance, so one measurement serves every number.
    let digit = text_width("0", size, false);
    for b in boxes {
        c.action_box(b.x, y, b.w, h, b.fill, &BoxTag { panel, ..b.tag });
        if !numbers || b.tag.count != 1 || size < 6.0 {
            continue;
        }
        let text = b.tag.microbatch.to_string();
        if b.w >= digit * text.len() as f64 + 4.0 {
            let spec = TextSpec::new(size, b.fill.ink(), Anchor::Middle);
            c.text(b.x + b.w / 2.0, y + h / 2.0, &text, spec);
        }
    }
}

/// Shared time axis under the last panel: time since each panel's own start.
fn draw_axis(c: &mut dyn Canvas, panels: &[PanelData<'_>], lay: &Layout) {
    let y = lay.axis_y + 4.0;
    c.line(&[(lay.x0, y), (lay.x1, y)], Rgb::MUTED, 1.0, false);
    let target = ((lay.x1 - lay.x0) / 90.0).max(2.0) as usize;
    let ticks = if lay.max_span > 0.0 {
        nice_ticks(0.0, lay.max_span, target)
    } else {
        vec![0.0]
    };
    for t in ticks {
        let x = lay.x0 + t * lay.px_per_unit;
        c.line(&[(x, y), (x, y + 4.0)], Rgb::MUTED, 1.0, false);
        let spec = TextSpec::new(LABEL_FONT - 1.0, Rgb::TEXT, Anchor::Middle);
        c.text(x, y + 13.0, &format_number(t), spec);
    }
    let unit = panels
        .first()
        .map_or("units", |p| p.tl.meta.time_unit.as_str());
    let spec = TextSpec::new(LABEL_FONT, Rgb::MUTED, Anchor::Middle);
    let label = format!("time since step start ({unit})");
    c.text((lay.x0 + lay.x1) / 2.0, y + 27.0, &label, spec);
}
