//! Pareto plot of a schedule search: bubble fraction against peak activation memory, every
//! candidate a dot, the front (nothing both smaller and faster) joined as a staircase, the
//! cap a dashed line and the chosen schedule ringed.

use crate::canvas::{frame, Anchor, Canvas, TextSpec};
use crate::layout::plot_size;
use crate::render::render;
use crate::style::{format_number, nice_ticks, series_color, Rgb};
use crate::{ChartOptions, ImageFormat, VizError};
#[cfg(feature = "search")]
use pipewright_search::{Objective, SearchOutcome};

/// One candidate of a search.
#[derive(Clone, Debug, PartialEq)]
pub struct ParetoPoint {
    /// What made it, e.g. `zbv` or `list v=2 loop, I/W, cap 8`.
    pub label: String,
    /// Peak stashed activations of the fullest device, in microbatch units.
    pub peak: f64,
    /// Bubble fraction in `[0, 1]`.
    pub bubble_fraction: f64,
    /// On the Pareto front.
    pub on_front: bool,
    /// The chosen schedule.
    pub best: bool,
}

#[cfg(feature = "search")]
impl ParetoPoint {
    /// Every candidate of a search as a point, its bubble the one the search minimised
    /// (steady-state for the period, single-step for the makespan).
    pub fn of_search(found: &SearchOutcome) -> Vec<ParetoPoint> {
        found
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| ParetoPoint {
                label: c.label.clone(),
                peak: c.peak_microbatches,
                bubble_fraction: match found.objective {
                    Objective::Period => c.bubble.steady_state,
                    Objective::Makespan => c.bubble.single_step,
                },
                on_front: found.front.contains(&i),
                best: i == found.best,
            })
            .collect()
    }
}

const DEFAULT_HEIGHT: u32 = 520;
const MIN_W: u32 = 480;
const MIN_H: u32 = 300;
const PAD_L: f64 = 64.0;
const PAD_R: f64 = 24.0;
const PAD_T: f64 = 58.0;
const PAD_B: f64 = 48.0;
const FONT: f64 = 11.0;

/// Draw the plot. `cap` (in microbatch units) draws a dashed vertical line.
pub fn pareto_plot(
    points: &[ParetoPoint],
    cap: Option<f64>,
    opts: &ChartOptions,
    fmt: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    let (w, h) = plot_size(opts, DEFAULT_HEIGHT, (MIN_W, MIN_H))?;
    let clean: Vec<&ParetoPoint> = points
        .iter()
        .filter(|p| p.peak.is_finite() && p.bubble_fraction.is_finite())
        .collect();
    let draw = |c: &mut dyn Canvas| draw_plot(c, &clean, cap, opts, (f64::from(w), f64::from(h)));
    render(fmt, w, h, draw)
}

/// Maps data to pixels.
struct Axes {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    xmax: f64,
    ymax: f64,
}

impl Axes {
    fn x(&self, v: f64) -> f64 {
        self.x0 + v / self.xmax * (self.x1 - self.x0)
    }
    fn y(&self, v: f64) -> f64 {
        self.y1 - v / self.ymax * (self.y1 - self.y0)
    }
}

fn draw_plot(
    c: &mut dyn Canvas,
    pts: &[&ParetoPoint],
    cap: Option<f64>,
    opts: &ChartOptions,
    (w, h): (f64, f64),
) {
    let title = opts
        .title
        .as_deref()
        .unwrap_or("schedule search: bubble against peak memory");
    let bold = TextSpec::new(15.0, Rgb::TEXT, Anchor::Middle).bold();
    c.text(w / 2.0, 18.0, title, bold);
    if let Some(best) = pts.iter().find(|p| p.best) {
        let line = format!(
            "best: {} (bubble {}%, peak {} microbatches)",
            best.label,
            format_number((best.bubble_fraction * 1000.0).round() / 10.0),
            format_number((best.peak * 100.0).round() / 100.0)
        );
        c.text(
            w / 2.0,
            38.0,
            &line,
            TextSpec::new(12.0, BEST, Anchor::Middle),
        );
    }
    let xmax = pts.iter().map(|p| p.peak).chain(cap).fold(0.0, f64::max);
    let ymax = pts.iter().map(|p| p.bubble_fraction).fold(0.0, f64::max);
    let a = Axes {
        x0: PAD_L,
        x1: w - PAD_R,
        y0: PAD_T,
        y1: h - PAD_B,
        xmax: if xmax > 0.0 { xmax * 1.08 } else { 1.0 },
        ymax: if ymax > 0.0 { ymax * 1.1 } else { 0.1 },
    };
    draw_axes(c, &a);
    if let Some(cap) = cap {
        let x = a.x(cap);
        c.line(&[(x, a.y0), (x, a.y1)], Rgb::CAP, 1.0, true);
        let spec = TextSpec::new(FONT - 1.0, Rgb::CAP, Anchor::End);
        c.text(
            x - 4.0,
            a.y0 + 8.0,
            &format!("cap {}", format_number(cap)),
            spec,
        );
    }
    for p in pts.iter().filter(|p| !p.on_front) {
        c.rect(
            a.x(p.peak) - 2.0,
            a.y(p.bubble_fraction) - 2.0,
            4.0,
            4.0,
            OTHER,
        );
    }
    draw_front(c, pts, &a);
    if let Some(best) = pts.iter().find(|p| p.best) {
        let (x, y) = (a.x(best.peak), a.y(best.bubble_fraction));
        frame(c, x - 6.0, y - 6.0, 12.0, 12.0, BEST);
    }
}

const OTHER: Rgb = Rgb(170, 170, 170);
const BEST: Rgb = Rgb(200, 30, 30);

/// The front as a staircase: each point holds until the next, smaller-bubble one.
fn draw_front(c: &mut dyn Canvas, pts: &[&ParetoPoint], a: &Axes) {
    let mut front: Vec<&&ParetoPoint> = pts.iter().filter(|p| p.on_front).collect();
    front.sort_by(|p, q| p.peak.total_cmp(&q.peak));
    let color = series_color(0);
    let mut stair = Vec::new();
    for (i, p) in front.iter().enumerate() {
        let (x, y) = (a.x(p.peak), a.y(p.bubble_fraction));
        if i > 0 {
            stair.push((x, stair.last().map_or(y, |l: &(f64, f64)| l.1)));
        }
        stair.push((x, y));
    }
    c.line(&stair, color, 1.5, false);
    for (i, p) in front.iter().enumerate() {
        let (x, y) = (a.x(p.peak), a.y(p.bubble_fraction));
        c.rect(x - 3.5, y - 3.5, 7.0, 7.0, color);
        // Alternate above and below so neighbours' labels do not collide.
        let dy = if i % 2 == 0 { -10.0 } else { 12.0 };
        let anchor = if x > (a.x0 + a.x1) / 2.0 {
            Anchor::End
        } else {
            Anchor::Start
        };
        let dx = if anchor == Anchor::End { -6.0 } else { 6.0 };
        c.text(
            x + dx,
            y + dy,
            &p.label,
            TextSpec::new(FONT - 1.0, Rgb::TEXT, anchor),
        );
    }
}

fn draw_axes(c: &mut dyn Canvas, a: &Axes) {
    let small = TextSpec::new(FONT - 1.0, Rgb::TEXT, Anchor::End);
    for t in nice_ticks(0.0, a.ymax, 5) {
        let y = a.y(t);
        c.line(&[(a.x0, y), (a.x1, y)], Rgb::GRID, 1.0, false);
        let label = format!("{}%", format_number((t * 1000.0).round() / 10.0));
        c.text(a.x0 - 6.0, y, &label, small);
    }
    let mid = TextSpec::new(FONT - 1.0, Rgb::TEXT, Anchor::Middle);
    for t in nice_ticks(0.0, a.xmax, 8) {
        let x = a.x(t);
        c.line(&[(x, a.y1), (x, a.y1 + 4.0)], Rgb::MUTED, 1.0, false);
        c.text(x, a.y1 + 13.0, &format_number(t), mid);
    }
    frame(c, a.x0, a.y0, a.x1 - a.x0, a.y1 - a.y0, Rgb::FRAME);
    let label = TextSpec::new(FONT, Rgb::MUTED, Anchor::Middle);
    c.text(
        (a.x0 + a.x1) / 2.0,
        a.y1 + 31.0,
        "peak activation memory per device (microbatches of one device's share)",
        label,
    );
    c.text(a.x0 - 40.0, a.y0 - 14.0, "bubble", label);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(label: &str, peak: f64, bubble: f64, on_front: bool, best: bool) -> ParetoPoint {
        ParetoPoint {
            label: label.into(),
            peak,
            bubble_fraction: bubble,
            on_front,
            best,
        }
    }

    #[test]
    fn draws_every_candidate_the_front_labels_and_the_cap() {
        let pts = [
            point("1f1b", 4.0, 0.27, false, false),
            point("zb-h1", 4.0, 0.08, true, false),
            point("list v=2 loop, I/W, cap 6", 6.0, 0.01, true, true),
            point("gpipe", 8.0, 0.27, false, false),
        ];
        let svg = pareto_plot(&pts, Some(6.0), &ChartOptions::default(), ImageFormat::Svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains(">zb-h1<") && svg.contains(">list v=2 loop, I/W, cap 6<"));
        assert!(!svg.contains(">gpipe<"), "only the front is labelled");
        assert!(svg.contains("cap 6") && svg.contains("best: list v=2 loop, I/W, cap 6"));
        let png = pareto_plot(&pts, None, &ChartOptions::default(), ImageFormat::Png);
        #[cfg(feature = "png")]
        assert_eq!(&png.unwrap()[1..4], b"PNG");
        #[cfg(not(feature = "png"))]
        assert!(matches!(png, Err(VizError::PngNotBuilt)));
    }
}
