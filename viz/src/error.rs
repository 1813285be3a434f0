//! The one error type of this crate.

use std::path::PathBuf;

/// Why a chart could not be made. Every message is one line that says what to change.
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// The output file's extension names no image format we write.
    #[error("cannot tell the image format of `{}`: use a .svg or .png file name", .0.display())]
    UnknownExtension(PathBuf),
    /// The requested image is too small for what must go in it.
    #[error("a {width}x{height} image is too small for this chart: it needs at least {min_width}x{min_height} pixels")]
    TooSmall {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
        /// Smallest width that works.
        min_width: u32,
        /// Smallest height that works.
        min_height: u32,
    },
    /// The requested image is larger than we are willing to allocate.
    #[error("a {width}x{height} image is too large: at most {max} pixels on a side")]
    TooLarge {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
        /// Largest side allowed.
        max: u32,
    },
    /// Nothing was given to draw.
    #[error("nothing to draw: give at least one timeline")]
    NoPanels,
    /// A timeline holds a time that is not a finite number.
    #[error("timeline `{0}` has an event with a start or end that is not a finite number")]
    NonFiniteTime(String),
    /// Every event has zero length, so there is no time axis to draw on.
    #[error("timeline `{0}` takes no time (every event has zero length, e.g. all costs 0): nothing to draw on a time axis; give costs above 0")]
    ZeroSpan(String),
    /// The embedded font could not be loaded (a build problem, not a user one).
    #[error("the embedded DejaVu Sans font could not be loaded")]
    Font,
    /// A PNG was asked of a build without the `png` feature.
    #[error("this build of pipewright writes SVG charts only: write a .svg file, or build with the `png` feature")]
    PngNotBuilt,
    /// Plotters failed while drawing a PNG.
    #[error("drawing failed: {0}")]
    Draw(String),
    /// PNG encoding failed.
    #[error("PNG encoding failed: {0}")]
    Png(String),
}
