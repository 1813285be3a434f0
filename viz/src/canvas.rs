//! A tiny drawing surface with two implementations: a direct SVG writer and a plotters
//! bitmap backend (encoded to PNG). The bubble chart draws once against [`Canvas`], so SVG
//! and PNG show the same layout.
//!
//! Why not plotters' own SVG backend for charts: it cannot tag a `<rect>` with what it shows
//! (tests and people hovering need `0F3`), and a direct writer is several times faster on
//! 100,000 boxes.

use std::fmt::Write as _;
use std::sync::OnceLock;

use pipewright_schedule::ActionKind;
use plotters::prelude::{BitMapBackend, DrawingBackend, RGBColor, ShapeStyle};
use plotters::style::{Color, FontStyle, RGBAColor};

use crate::style::Rgb;
use crate::text::{raster, text_width};
use crate::VizError;

/// Font family name the embedded DejaVu Sans is registered under with plotters.
pub(crate) const FONT: &str = "sans-serif";
/// What SVG viewers are asked for: DejaVu Sans where installed, a sans-serif otherwise.
const SVG_FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

/// Load the embedded DejaVu Sans, and register it with plotters too, so any plotters text
/// uses it rather than looking for system fonts.
pub(crate) fn ensure_font() -> Result<(), VizError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = DONE.get_or_init(|| {
        let regular =
            plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let bold = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
        regular.is_ok() && bold.is_ok()
    });
    crate::text::ensure_fonts()?;
    if *ok {
        Ok(())
    } else {
        Err(VizError::Font)
    }
}

/// Baseline below a text's vertical centre, in em: DejaVu's digits and capitals are ~0.73 em
/// tall, so this centres them.
const BASELINE: f64 = 0.36;

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

/// Draws on an RGB pixel buffer through plotters' bitmap backend.
pub(crate) struct BitmapCanvas<'a> {
    backend: BitMapBackend<'a>,
    /// First drawing error; later calls are skipped and it is reported by `finish`.
    error: Option<String>,
}

fn color(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

impl<'a> BitmapCanvas<'a> {
    pub fn new(buf: &'a mut [u8], width: u32, height: u32) -> Self {
        let mut backend = BitMapBackend::with_buffer(buf, (width, height));
        let style = ShapeStyle::from(&color(Rgb::WHITE)).filled();
        let _ = backend.draw_rect((0, 0), (width as i32, height as i32), &style, true);
        BitmapCanvas {
            backend,
            error: None,
        }
    }

    pub fn finish(mut self) -> Result<(), VizError> {
        if let Err(e) = self.backend.present() {
            self.error.get_or_insert(e.to_string());
        }
        match self.error {
            Some(e) => Err(VizError::Draw(e)),
            None => Ok(()),
        }
    }

    fn record<E: std::fmt::Display>(&mut self, r: Result<(), E>) {
        if let Err(e) = r {
            self.error.get_or_insert(e.to_string());
        }
    }
}

/// Pixel span `[a, b)` of a float span, at least one pixel wide, so a thin box is drawn where
/// it is rather than dropped or moved.
fn px_span(a: f64, len: f64) -> (i32, i32) {
    let lo = a.round() as i32;
    let hi = ((a + len).round() as i32).max(lo + 1);
    (lo, hi)
}

impl Canvas for BitmapCanvas<'_> {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb) {
        let (x0, x1) = px_span(x, w);
        let (y0, y1) = px_span(y, h);
        let style = ShapeStyle::from(&color(fill)).filled();
        let r = self.backend.draw_rect((x0, y0), (x1, y1), &style, true);
        self.record(r);
    }

    fn action_box(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb, _tag: &BoxTag) {
        self.rect(x, y, w, h, fill);
    }

    fn line(&mut self, pts: &[(f64, f64)], c: Rgb, width: f64, dashed: bool) {
        let style = ShapeStyle::from(&color(c)).stroke_width(width.round().max(1.0) as u32);
        let ipts: Vec<(i32, i32)> = pts
            .iter()
            .map(|&(x, y)| (x.round() as i32, y.round() as i32))
            .collect();
        if !dashed {
            let r = self.backend.draw_path(ipts, &style);
            self.record(r);
            return;
        }
        for seg in ipts.windows(2) {
            for (a, b) in dashes(seg[0], seg[1], 5.0, 3.0) {
                let r = self.backend.draw_line(a, b, &style);
                self.record(r);
            }
        }
    }

    fn text(&mut self, x: f64, y: f64, s: &str, spec: TextSpec) {
        let w = text_width(s, spec.size, spec.bold);
        let left = match spec.anchor {
            Anchor::Start => x,
            Anchor::Middle => x - w / 2.0,
            Anchor::End => x - w,
        };
        let rgb = spec.color;
        let backend = &mut self.backend;
        let mut err = None;
        let mut plot = |px: i32, py: i32, cov: f32| {
            let c = RGBAColor(rgb.0, rgb.1, rgb.2, f64::from(cov.min(1.0)));
            if let Err(e) = backend.draw_pixel((px, py), c.to_backend_color()) {
                err.get_or_insert(e.to_string());
            }
        };
        raster(
            s,
            spec.size,
            spec.bold,
            (left, y + BASELINE * spec.size),
            &mut plot,
        );
        if let Some(e) = err {
            self.error.get_or_insert(e);
        }
    }
}

/// Dash segments of the line from `a` to `b`: `on` pixels drawn, `off` skipped.
fn dashes(a: (i32, i32), b: (i32, i32), on: f64, off: f64) -> Vec<((i32, i32), (i32, i32))> {
    let (dx, dy) = (f64::from(b.0 - a.0), f64::from(b.1 - a.1));
    let len = dx.hypot(dy);
    let mut out = Vec::new();
    let mut t = 0.0;
    while t < len {
        let e = (t + on).min(len);
        let p = |s: f64| {
            (
                (f64::from(a.0) + dx * s / len).round() as i32,
                (f64::from(a.1) + dy * s / len).round() as i32,
            )
        };
        out.push((p(t), p(e)));
        t += on + off;
    }
    out
}

/// Largest side we allocate a bitmap for (16k x 16k x 3 bytes is 768 MiB already).
pub(crate) const MAX_SIDE: u32 = 16_384;

/// Draw with `draw` on a fresh `width` x `height` bitmap and encode it as PNG.
pub(crate) fn render_png(
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    ensure_font()?;
    let mut buf = vec![255u8; width as usize * height as usize * 3];
    {
        let mut canvas = BitmapCanvas::new(&mut buf, width, height);
        draw(&mut canvas);
        canvas.finish()?;
    }
    encode_png(&buf, width, height)
}

/// Encode an RGB8 buffer as PNG.
pub(crate) fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, VizError> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc
            .write_header()
            .map_err(|e| VizError::Png(e.to_string()))?;
        w.write_image_data(rgb)
            .map_err(|e| VizError::Png(e.to_string()))?;
    }
    Ok(out)
}

/// Draw with `draw` on a `width` x `height` image of format `fmt`.
pub(crate) fn render(
    fmt: crate::ImageFormat,
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    match fmt {
        crate::ImageFormat::Svg => render_svg(width, height, draw),
        crate::ImageFormat::Png => render_png(width, height, draw),
    }
}

/// Draw with `draw` into an SVG document.
pub(crate) fn render_svg(
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    ensure_font()?;
    let mut canvas = SvgCanvas::new(width, height);
    draw(&mut canvas);
    Ok(canvas.finish())
}
