//! The memory panel: stashed activation bytes over time, one step line per device, on the
//! chart's time axis and one byte scale shared by all panels (so comparisons are fair).

use pipewright_schedule::MemorySample;

use crate::canvas::{frame, Anchor, Canvas, TextSpec};
use crate::layout::{Layout, PanelData};
use crate::style::{byte_ticks, format_bytes, format_number, nice_ticks, series_color, Rgb};
use crate::text::text_width;

const FONT: f64 = 10.0;
/// Devices beyond this many are drawn but not named in the panel's key.
const MAX_KEYED: usize = 16;

/// Where a memory panel goes and its scale.
pub(crate) struct MemArea {
    pub y: f64,
    pub h: f64,
    pub scale: MemScale,
}

/// The memory panels' shared vertical scale: bytes, or activation counts when no sample has
/// a byte size (a cost model without activation sizes), so the panel still says something.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemScale {
    pub max: f64,
    pub bytes: bool,
}

impl MemScale {
    fn value(&self, s: &MemorySample) -> f64 {
        if self.bytes {
            s.bytes as f64
        } else {
            f64::from(s.count)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let t = if self.bytes {
            byte_ticks(self.max, 3)
        } else {
            nice_ticks(0.0, self.max, 3)
        };
        // Below one unit ticks would repeat a rounded label ("0 B", "0 B").
        t.into_iter().filter(|v| v.fract() == 0.0).collect()
    }

    fn label(&self, v: f64) -> String {
        if self.bytes {
            format_bytes(v)
        } else {
            format_number(v)
        }
    }
}

/// Largest value across every panel's memory track (and the cap, for bytes); at least 1.
pub(crate) fn shared_scale(panels: &[PanelData<'_>], cap: Option<u64>) -> MemScale {
    let samples = || panels.iter().filter_map(|p| p.memory).flatten().flatten();
    let peak_bytes = samples().map(|s| s.bytes).max().unwrap_or(0);
    if peak_bytes == 0 {
        let peak = samples().map(|s| s.count).max().unwrap_or(0);
        return MemScale {
            max: f64::from(peak).max(1.0),
            bytes: false,
        };
    }
    let peak = peak_bytes.max(cap.unwrap_or(0));
    MemScale {
        max: peak as f64,
        bytes: true,
    }
}

/// Draw one memory panel.
pub(crate) fn draw_memory(
    c: &mut dyn Canvas,
    mem: &[Vec<MemorySample>],
    p: &PanelData<'_>,
    lay: &Layout,
    area: &MemArea,
    cap: Option<u64>,
) {
    let sc = area.scale;
    let head = if sc.bytes {
        "activation memory per device"
    } else {
        "activations in flight per device"
    };
    draw_key(c, head, mem.len(), lay.x0, area.y - 9.0);
    frame(c, lay.x0, area.y, lay.x1 - lay.x0, area.h, Rgb::FRAME);
    let to_y = |b: f64| area.y + area.h - b / sc.max * area.h;
    for t in sc.ticks() {
        let y = to_y(t);
        c.line(&[(lay.x0, y), (lay.x1, y)], Rgb::GRID, 1.0, false);
        let spec = TextSpec::new(FONT, Rgb::TEXT, Anchor::End);
        c.text(lay.x0 - 6.0, y, &sc.label(t), spec);
    }
    let to_x = |t: f64| lay.x0 + (t - p.start) * lay.px_per_unit;
    let end = p.start + p.span;
    for (d, samples) in mem.iter().enumerate() {
        let pts = step_points(samples, end, &to_x, &|s| to_y(sc.value(s)));
        c.line(&thin(pts), series_color(d), 1.5, false);
    }
    if let Some(cap) = cap.filter(|_| sc.bytes) {
        let y = to_y(cap as f64);
        c.line(&[(lay.x0, y), (lay.x1, y)], Rgb::CAP, 1.0, true);
        let spec = TextSpec::new(FONT, Rgb::CAP, Anchor::Start);
        c.text(lay.x1 + 6.0, y, "cap", spec);
    }
}

/// "activation memory  ■ dev 0  ■ dev 1 …" above the panel.
fn draw_key(c: &mut dyn Canvas, head: &str, devices: usize, x0: f64, y: f64) {
    c.text(
        x0,
        y,
        head,
        TextSpec::new(FONT + 1.0, Rgb::MUTED, Anchor::Start),
    );
    let mut x = x0 + text_width(head, FONT + 1.0, false) + 12.0;
    for d in 0..devices.min(MAX_KEYED) {
        c.line(&[(x, y), (x + 14.0, y)], series_color(d), 2.0, false);
        let label = format!("dev {d}");
        c.text(
            x + 17.0,
            y,
            &label,
            TextSpec::new(FONT, Rgb::TEXT, Anchor::Start),
        );
        x += 17.0 + text_width(&label, FONT, false) + 10.0;
    }
}

/// Corners of the step function: each sample holds from its time until the next one, the
/// last until `end` (or its own time if later).
fn step_points(
    samples: &[MemorySample],
    end: f64,
    to_x: &dyn Fn(f64) -> f64,
    to_y: &dyn Fn(&MemorySample) -> f64,
) -> Vec<(f64, f64)> {
    let mut sorted: Vec<&MemorySample> = samples.iter().filter(|s| s.time.is_finite()).collect();
    sorted.sort_by(|a, b| a.time.total_cmp(&b.time));
    let mut pts = Vec::with_capacity(sorted.len() * 2 + 1);
    for (i, s) in sorted.iter().enumerate() {
        let y = to_y(s);
        pts.push((to_x(s.time), y));
        let next = sorted.get(i + 1).map_or(end.max(s.time), |n| n.time);
        pts.push((to_x(next), y));
    }
    pts
}

/// Drop corners that cannot be seen: within one half-pixel column keep only the first,
/// lowest, highest and last point, so a dense track stays a few points per pixel and its
/// extremes stay where they are.
fn thin(pts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if pts.len() < 64 {
        return pts;
    }
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(pts.len().min(8192));
    let mut i = 0;
    while i < pts.len() {
        let col = (pts[i].0 * 2.0).floor();
        let j = pts[i..]
            .iter()
            .position(|p| (p.0 * 2.0).floor() != col)
            .map_or(pts.len(), |n| i + n);
        let run = &pts[i..j];
        let lo = run
            .iter()
            .copied()
            .fold(run[0], |a, b| if b.1 < a.1 { b } else { a });
        let hi = run
            .iter()
            .copied()
            .fold(run[0], |a, b| if b.1 > a.1 { b } else { a });
        for q in [run[0], lo, hi, run[run.len() - 1]] {
            if out.last() != Some(&q) {
                out.push(q);
            }
        }
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_hold_until_the_next_sample() {
        let s = [
            MemorySample {
                time: 0.0,
                count: 1,
                bytes: 10,
            },
            MemorySample {
                time: 2.0,
                count: 2,
                bytes: 20,
            },
        ];
        let pts = step_points(&s, 5.0, &|t| t, &|s| s.bytes as f64);
        assert_eq!(
            pts,
            vec![(0.0, 10.0), (2.0, 10.0), (2.0, 20.0), (5.0, 20.0)]
        );
    }

    #[test]
    fn thinning_keeps_extremes() {
        let pts: Vec<(f64, f64)> = (0..1000)
            .map(|i| (f64::from(i) * 0.01, f64::from(i % 7)))
            .collect();
        let t = thin(pts);
        assert!(t.len() < 100, "{}", t.len());
        assert!(t.iter().any(|p| p.1 == 0.0) && t.iter().any(|p| p.1 == 6.0));
    }
}
