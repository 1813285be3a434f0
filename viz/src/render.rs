//! Drawing a chart in the format asked for: the SVG canvas, or the PNG one (feature `png`).
//! It sits above both canvases, so neither imports the other's caller.

use crate::canvas::{Canvas, SvgCanvas};
use crate::text::ensure_fonts;
use crate::VizError;

/// Draw with `draw` on a `width` x `height` image of format `fmt`, once the embedded font,
/// which measures text in both formats and draws it in PNG, is loaded.
pub(crate) fn render(
    fmt: crate::ImageFormat,
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    ensure_fonts()?;
    match fmt {
        crate::ImageFormat::Svg => Ok(render_svg(width, height, draw)),
        #[cfg(feature = "png")]
        crate::ImageFormat::Png => crate::bitmap::render_png(width, height, draw),
        #[cfg(not(feature = "png"))]
        crate::ImageFormat::Png => Err(VizError::PngNotBuilt),
    }
}

/// Draw with `draw` into an SVG document.
fn render_svg(width: u32, height: u32, draw: impl FnOnce(&mut dyn Canvas)) -> Vec<u8> {
    let mut canvas = SvgCanvas::new(width, height);
    draw(&mut canvas);
    canvas.finish()
}
