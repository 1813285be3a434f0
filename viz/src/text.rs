//! Text with the embedded DejaVu Sans: measuring (for layout, in both formats) and
//! rasterising (for PNG).
//!
//! Measuring reads the font's tables with ttf-parser alone, built without its layout and
//! variable-font code, so an SVG-only build (no feature `png`) needs no more. The arithmetic
//! is ab_glyph's, in its order, so a width is the same to the bit as when ab_glyph measured.
//!
//! We rasterise with ab_glyph ourselves rather than through plotters' text path: plotters
//! 0.3.7 places each glyph at the pen position without its left side bearing and rounds the
//! pen per glyph, which gives uneven letter spacing and misplaced periods ("25·0%").

use std::sync::OnceLock;

use ttf_parser::{cmap, kern, Face, GlyphId};

use crate::VizError;

/// One face of the embedded font, with the tables measuring reads.
struct Metrics {
    face: Face<'static>,
    /// Unicode character maps, in the font's order.
    cmap: Vec<cmap::Subtable<'static>>,
    /// Horizontal, non-variable kerning, in the font's order.
    kern: Vec<kern::Subtable<'static>>,
    /// The outlines, for PNG.
    #[cfg(feature = "png")]
    outlines: ab_glyph::FontRef<'static>,
}

impl Metrics {
    fn parse(data: &'static [u8]) -> Option<Metrics> {
        let face = Face::parse(data, 0).ok()?;
        let tables = face.tables();
        let cmap = tables.cmap.iter().flat_map(|t| t.subtables);
        let kern = tables.kern.iter().flat_map(|t| t.subtables);
        Some(Metrics {
            cmap: cmap.filter(|t| t.is_unicode()).collect(),
            kern: kern.filter(|t| t.horizontal && !t.variable).collect(),
            face,
            #[cfg(feature = "png")]
            outlines: ab_glyph::FontRef::try_from_slice(data).ok()?,
        })
    }

    /// The glyph of `c` (0, the missing glyph, when the font has none).
    fn glyph(&self, c: char) -> GlyphId {
        let found = self.cmap.iter().find_map(|t| t.glyph_index(u32::from(c)));
        found.unwrap_or(GlyphId(0))
    }

    /// Advance of `id` in font units.
    fn advance(&self, id: GlyphId) -> f32 {
        f32::from(self.face.glyph_hor_advance(id).unwrap_or_default())
    }

    /// Kerning between `a` and `b` in font units.
    fn kern(&self, a: GlyphId, b: GlyphId) -> f32 {
        let found = self.kern.iter().find_map(|t| t.glyphs_kerning(a, b));
        f32::from(found.unwrap_or_default())
    }

    /// ab_glyph's scale for text of `size` px (em): it scales by the font's height (ascent -
    /// descent), and we size text by its em, as SVG's `font-size` does, so both formats agree.
    fn px_scale(&self, size: f64) -> f32 {
        size as f32 * self.height() / f32::from(self.face.units_per_em())
    }

    fn height(&self) -> f32 {
        f32::from(self.face.ascender()) - f32::from(self.face.descender())
    }

    /// Pixels per font unit across, for text of `size` px.
    fn h_factor(&self, size: f64) -> f32 {
        self.px_scale(size) / self.height()
    }
}

struct Fonts {
    regular: Metrics,
    bold: Metrics,
}

fn fonts() -> Option<&'static Fonts> {
    static FONTS: OnceLock<Option<Fonts>> = OnceLock::new();
    FONTS
        .get_or_init(|| {
            let regular = Metrics::parse(dejavu::sans::regular())?;
            let bold = Metrics::parse(dejavu::sans::bold())?;
            Some(Fonts { regular, bold })
        })
        .as_ref()
}

/// Load the embedded fonts, or say why not (only a broken build can fail here).
pub(crate) fn ensure_fonts() -> Result<(), VizError> {
    fonts().map(|_| ()).ok_or(VizError::Font)
}

fn font(bold: bool) -> Option<&'static Metrics> {
    fonts().map(|f| if bold { &f.bold } else { &f.regular })
}

/// Width in pixels of `text` set at `size` px (em).
pub(crate) fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let Some(f) = font(bold) else {
        return 0.6 * size * text.chars().count() as f64;
    };
    let h = f.h_factor(size);
    let mut w = 0.0f32;
    let mut prev: Option<GlyphId> = None;
    for c in text.chars() {
        let id = f.glyph(c);
        if let Some(p) = prev {
            w += h * f.kern(p, id);
        }
        w += h * f.advance(id);
        prev = Some(id);
    }
    f64::from(w)
}

/// `text` cut to at most `max_w` pixels, ending in `…` when cut.
pub(crate) fn fit_width(text: &str, size: f64, bold: bool, max_w: f64) -> String {
    if text_width(text, size, bold) <= max_w {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let cut = |k: usize| chars[..k].iter().collect::<String>().trim_end().to_string() + "…";
    let fits = |k: usize| text_width(&cut(k), size, bold) <= max_w;
    // A cut's width grows with the characters it keeps: bisect for the most that fit
    // (cutting one character at a time re-measured the text each time, a minute for a
    // 40,000-character title). `hi` never fits: all of the text already did not.
    let (mut lo, mut hi) = (0, chars.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if fits(lo) {
        cut(lo)
    } else {
        String::new()
    }
}

/// Rasterise `text` with its baseline's left end at `(x, baseline)`; `plot(x, y, coverage)`
/// receives every touched pixel.
#[cfg(feature = "png")]
pub(crate) fn raster(
    text: &str,
    size: f64,
    bold: bool,
    (x, baseline): (f64, f64),
    plot: &mut dyn FnMut(i32, i32, f32),
) {
    use ab_glyph::{point, Font, PxScale};
    let Some(f) = font(bold) else { return };
    let (px, h) = (PxScale::from(f.px_scale(size)), f.h_factor(size));
    let mut caret = x as f32;
    let mut prev: Option<GlyphId> = None;
    for c in text.chars() {
        let id = f.glyph(c);
        if let Some(p) = prev {
            caret += h * f.kern(p, id);
        }
        let at = point(caret, baseline as f32);
        let glyph = ab_glyph::GlyphId(id.0).with_scale_and_position(px, at);
        if let Some(outline) = f.outlines.outline_glyph(glyph) {
            let b = outline.px_bounds();
            outline.draw(|gx, gy, cov| {
                plot(b.min.x as i32 + gx as i32, b.min.y as i32 + gy as i32, cov)
            });
        }
        caret += h * f.advance(id);
        prev = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_share_one_advance_and_widths_add_up() {
        let one = text_width("0", 10.0, false);
        assert!((one - 6.36).abs() < 0.05, "{one}");
        assert!((text_width("12345", 10.0, false) - 5.0 * one).abs() < 0.01);
        assert!(text_width("bold", 12.0, true) > text_width("bold", 12.0, false));
    }

    /// ab_glyph's widths, as it measured them before `text_width` read the tables itself:
    /// every pair of printable ASCII characters (and a few more), both weights, four sizes.
    #[test]
    #[cfg(feature = "png")]
    fn widths_are_ab_glyphs_to_the_bit() {
        use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
        let chars: Vec<char> = (' '..='~').chain("…·Üé—".chars()).collect();
        for (bold, data) in [
            (false, dejavu::sans::regular()),
            (true, dejavu::sans::bold()),
        ] {
            let f = FontRef::try_from_slice(data).unwrap();
            let upem = f.units_per_em().unwrap();
            for size in [7.0, 10.0, 11.5, 16.0] {
                let sf = f.as_scaled(PxScale::from(size as f32 * f.height_unscaled() / upem));
                for &a in &chars {
                    for &b in &chars {
                        let (ga, gb) = (sf.glyph_id(a), sf.glyph_id(b));
                        let mut want = 0.0f32;
                        want += sf.h_advance(ga);
                        want += sf.kern(ga, gb);
                        want += sf.h_advance(gb);
                        let got = text_width(&format!("{a}{b}"), size, bold);
                        assert_eq!(got.to_bits(), f64::from(want).to_bits(), "{a}{b} at {size}");
                    }
                }
            }
        }
    }

    /// The same widths in a build without PNG (and so without ab_glyph), pinned.
    #[test]
    fn widths_are_pinned() {
        let pins = [
            ("AV 25.0%", 11.0, false, 0x404a_64c0_0000_0000u64),
            ("Tq…", 16.0, true, 0x4043_2f00_0000_0000),
        ];
        for (text, size, bold, bits) in pins {
            let w = text_width(text, size, bold);
            assert_eq!(w.to_bits(), bits, "{text}: {w}");
        }
    }

    #[test]
    fn fitting_cuts_with_an_ellipsis() {
        assert_eq!(fit_width("short", 10.0, false, 500.0), "short");
        let cut = fit_width("a rather long label indeed", 10.0, false, 60.0);
        assert!(
            cut.ends_with('…') && text_width(&cut, 10.0, false) <= 60.0,
            "{cut}"
        );
        assert_eq!(fit_width("abc", 10.0, false, 1.0), "");
    }

    #[test]
    fn a_long_title_is_cut_in_a_moment_to_the_most_that_fits() {
        let title = "pipeline ".repeat(20_000);
        let started = std::time::Instant::now();
        let cut = fit_width(&title, 16.0, true, 1184.0);
        let took = started.elapsed();
        assert!(took.as_secs_f64() < 2.0, "{took:?}");
        assert!(text_width(&cut, 16.0, true) <= 1184.0, "{cut}");
        // One more character of the title would not fit.
        let kept = cut.trim_end_matches('…').chars().count();
        let more: String = title.chars().take(kept + 2).collect::<String>() + "…";
        assert!(text_width(&more, 16.0, true) > 1184.0, "{cut}");
    }

    #[test]
    #[cfg(feature = "png")]
    fn raster_touches_pixels_near_the_baseline() {
        let mut ys = Vec::new();
        raster("8", 20.0, false, (0.0, 30.0), &mut |_, y, c| {
            if c > 0.5 {
                ys.push(y)
            }
        });
        let (lo, hi) = (*ys.iter().min().unwrap(), *ys.iter().max().unwrap());
        assert!(
            (28..=30).contains(&hi) && (14..=17).contains(&lo),
            "{lo}..{hi}"
        );
    }
}
