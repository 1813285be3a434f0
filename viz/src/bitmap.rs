//! The PNG canvas (feature `png`): plotters' bitmap backend fills boxes and draws lines on an
//! RGB buffer, our own rasteriser (`text.rs`) draws the text, and `png` encodes the buffer.

use plotters::prelude::{BitMapBackend, DrawingBackend, RGBColor, ShapeStyle};
use plotters::style::{Color, RGBAColor};

use crate::canvas::{Anchor, BoxTag, Canvas, TextSpec, BASELINE};
use crate::style::Rgb;
use crate::text::{raster, text_width};
use crate::VizError;

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

/// Draw with `draw` on a fresh `width` x `height` bitmap and encode it as PNG.
pub(crate) fn render_png(
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
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
