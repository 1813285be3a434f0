//! Drawing a chart in the format asked for: the SVG canvas, or the PNG one (feature `png`).
//! It sits above both canvases, so neither imports the other's caller.

use crate::canvas::{ensure_font, Canvas, SvgCanvas};
use crate::VizError;

/// Draw with `draw` on a `width` x `height` image of format `fmt`.
pub(crate) fn render(
    fmt: crate::ImageFormat,
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    match fmt {
        crate::ImageFormat::Svg => render_svg(width, height, draw),
        #[cfg(feature = "png")]
        crate::ImageFormat::Png => crate::bitmap::render_png(width, height, draw),
        #[cfg(not(feature = "png"))]
        crate::ImageFormat::Png => Err(VizError::PngNotBuilt),
    }
}

/// Draw with `draw` into an SVG document.
fn render_svg(
    width: u32,
    height: u32,
    draw: impl FnOnce(&mut dyn Canvas),
) -> Result<Vec<u8>, VizError> {
    ensure_font()?;
    let mut canvas = SvgCanvas::new(width, height);
    draw(&mut canvas);
    Ok(canvas.finish())
}
