//! Text with the embedded DejaVu Sans: measuring (for layout, in both formats) and
//! rasterising (for PNG).
//!
//! We rasterise with ab_glyph ourselves rather than through plotters' text path: plotters
//! 0.3.7 places each glyph at the pen position without its left side bearing and rounds the
//! pen per glyph, which gives uneven letter spacing and misplaced periods ("25·0%").

use std::sync::OnceLock;

#[cfg(feature = "png")]
use ab_glyph::point;
use ab_glyph::{Font, FontRef, GlyphId, PxScale, ScaleFont};

use crate::VizError;

struct Fonts {
    regular: FontRef<'static>,
    bold: FontRef<'static>,
}

fn fonts() -> Option<&'static Fonts> {
    static FONTS: OnceLock<Option<Fonts>> = OnceLock::new();
    FONTS
        .get_or_init(|| {
            let regular = FontRef::try_from_slice(dejavu::sans::regular()).ok()?;
            let bold = FontRef::try_from_slice(dejavu::sans::bold()).ok()?;
            Some(Fonts { regular, bold })
        })
        .as_ref()
}

/// Load the embedded fonts, or say why not (only a broken build can fail here).
pub(crate) fn ensure_fonts() -> Result<(), VizError> {
    fonts().map(|_| ()).ok_or(VizError::Font)
}

fn font(bold: bool) -> Option<&'static FontRef<'static>> {
    fonts().map(|f| if bold { &f.bold } else { &f.regular })
}

/// ab_glyph scales by the font's height (ascent - descent); we size text by its em, as SVG's
/// `font-size` does, so both formats agree.
fn scale(f: &FontRef<'_>, size: f64) -> PxScale {
    let upem = f.units_per_em().unwrap_or(2048.0);
    PxScale::from(size as f32 * f.height_unscaled() / upem)
}

/// Width in pixels of `text` set at `size` px (em).
pub(crate) fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let Some(f) = font(bold) else {
        return 0.6 * size * text.chars().count() as f64;
    };
    let sf = f.as_scaled(scale(f, size));
    let mut w = 0.0f32;
    let mut prev: Option<GlyphId> = None;
    for c in text.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            w += sf.kern(p, id);
        }
        w += sf.h_advance(id);
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
    let Some(f) = font(bold) else { return };
    let px = scale(f, size);
    let sf = f.as_scaled(px);
    let mut caret = x as f32;
    let mut prev: Option<GlyphId> = None;
    for c in text.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            caret += sf.kern(p, id);
        }
        let glyph = id.with_scale_and_position(px, point(caret, baseline as f32));
        if let Some(outline) = f.outline_glyph(glyph) {
            let b = outline.px_bounds();
            outline.draw(|gx, gy, cov| {
                plot(b.min.x as i32 + gx as i32, b.min.y as i32 + gy as i32, cov)
            });
        }
        caret += sf.h_advance(id);
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
