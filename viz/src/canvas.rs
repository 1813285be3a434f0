//! A tiny drawing surface with two implementations: a direct SVG writer here, and a plotters
//! bitmap encoded to PNG (`bitmap.rs`, feature `png`); `render.rs` picks one. The bubble chart
//! draws once against [`Canvas`], so SVG and PNG show the same layout.
//!
//! Why not plotters' own SVG backend for charts: it cannot tag a `<rect>` with what it shows
//! (tests and people hovering need `0F3`), and a direct writer is several times faster on
//! 100,000 boxes.

use std::fmt::Write as _;

use pipewright_schedule::ActionKind;

use crate::style::Rgb;

/// What SVG viewers are asked for: DejaVu Sans where installed, a sans-serif otherwise.
const SVG_FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

/// Baseline below a text's vertical centre, in em: DejaVu's digits and capitals are ~0.73 em
/// tall, so this centres them.
pub(crate) const BASELINE: f64 = 0.36;

/// Horizontal anchor of a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

/// How a text looks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TextSpec {
    pub size: f64,
    pub color: Rgb,
    pub anchor: Anchor,
    pub bold: bool,
}

impl TextSpec {
    pub fn new(size: f64, color: Rgb, anchor: Anchor) -> Self {
        TextSpec {
            size,
            color,
            anchor,
            bold: false,
        }
    }

    pub fn bold(mut self) -> Self {
        self.bold = true;
        self
    }
}

/// What one drawn action box stands for; the SVG writer turns it into attributes and a
/// `<title>` tooltip so a box can be identified.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BoxTag {
    /// Index of the chart panel (timeline) the box belongs to.
    pub panel: usize,
    pub device: u32,
    pub stage: u32,
    pub kind: ActionKind,
    pub microbatch: u32,
    pub start: f64,
    pub end: f64,
    /// How many actions this box stands for: 1, or more when sub-pixel boxes were merged.
    pub count: u32,
}

/// A drawing surface in pixel coordinates, origin top left. Text `y` is its vertical centre.
pub(crate) trait Canvas {
    /// A filled rectangle.
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb);
    /// A filled rectangle that shows an action (or a merged run of them).
    fn action_box(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb, tag: &BoxTag);
    /// An open polyline.
    fn line(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64, dashed: bool);
    /// One line of text.
    fn text(&mut self, x: f64, y: f64, s: &str, spec: TextSpec);
}

/// Rectangle outline, made of lines so both canvases draw it the same.
pub(crate) fn frame(c: &mut dyn Canvas, x: f64, y: f64, w: f64, h: f64, color: Rgb) {
    let pts = [(x, y), (x + w, y), (x + w, y + h), (x, y + h), (x, y)];
    c.line(&pts, color, 1.0, false);
}

/// Writes SVG text directly.
pub(crate) struct SvgCanvas {
    out: String,
}

impl SvgCanvas {
    pub fn new(width: u32, height: u32) -> Self {
        let mut out = String::with_capacity(1 << 16);
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="{SVG_FONT}">"#
        );
        out.push('\n');
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        SvgCanvas { out }
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push_str("</svg>\n");
        self.out.into_bytes()
    }
}

/// Escape text for SVG content and attributes.
fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

impl Canvas for SvgCanvas {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb) {
        let _ = writeln!(
            self.out,
            r#"<rect x="{x:.2}" y="{y:.2}" width="{w:.2}" height="{h:.2}" fill="{}"/>"#,
            fill.hex()
        );
    }

    fn action_box(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb, t: &BoxTag) {
        // Four decimals on x and width: box widths must stay proportional to durations
        // even for thin boxes in wide charts.
        let _ = write!(
            self.out,
            r#"<rect class="act {k}" data-panel="{p}" data-device="{d}" data-stage="{s}" data-mb="{m}" data-count="{n}" x="{x:.4}" y="{y:.2}" width="{w:.4}" height="{h:.2}" fill="{f}"><title>"#,
            k = t.kind,
            p = t.panel,
            d = t.device,
            s = t.stage,
            m = t.microbatch,
            n = t.count,
            f = fill.hex(),
        );
        if t.count == 1 {
            let _ = write!(
                self.out,
                "dev {} {}{}{}",
                t.device, t.stage, t.kind, t.microbatch
            );
        } else {
            let _ = write!(
                self.out,
                "dev {} {} {} merged actions",
                t.device, t.count, t.kind
            );
        }
        let _ = writeln!(self.out, " [{}, {}]</title></rect>", t.start, t.end);
    }

    fn line(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64, dashed: bool) {
        if pts.len() < 2 {
            return;
        }
        self.out.push_str(r#"<polyline fill="none" points=""#);
        for (x, y) in pts {
            let _ = write!(self.out, "{x:.2},{y:.2} ");
        }
        let dash = if dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            self.out,
            r#"" stroke="{}" stroke-width="{width}"{dash}/>"#,
            color.hex()
        );
    }

    fn text(&mut self, x: f64, y: f64, s: &str, spec: TextSpec) {
        let anchor = match spec.anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let weight = if spec.bold {
            r#" font-weight="bold""#
        } else {
            ""
        };
        let base = y + BASELINE * spec.size;
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{base:.1}" font-size="{:.1}" fill="{}" text-anchor="{anchor}"{weight}>{}</text>"#,
            spec.size,
            spec.color.hex(),
            escape(s)
        );
    }
}

/// Largest side we allocate a bitmap for (16k x 16k x 3 bytes is 768 MiB already).
pub(crate) const MAX_SIDE: u32 = 16_384;
