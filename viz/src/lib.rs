//! Bubble charts, comparisons, memory panels, sweep plots and terminal charts of
//! pipeline-parallel [`Timeline`]s, simulated or measured alike.
//!
//! A *bubble chart* has one row per device and time running to the right at true scale:
//! each compute action is a box coloured by kind (F forward, B backward, I backward for
//! inputs, W backward for weights), lighter for later model chunks (chunk = `stage / p`,
//! the local chunk index under both loop and V placement); sends and receives sit on a
//! thin comm lane under their device. White space inside a row's frame is the bubble, and
//! each row ends with its bubble percentage. Hand [`bubble_chart`] several [`ChartPanel`]s and
//! they are stacked on one time axis, so a shorter makespan is a shorter row.
//!
//! Everything returns bytes (or a `String`) rather than writing files, so a caller can write
//! atomically. Text is drawn with an embedded DejaVu Sans: PNGs come out the same on a bare
//! machine without fontconfig. PNG is the default feature `png` (plotters and png); without
//! it, SVG and terminal charts only, and a PNG is refused with [`VizError::PngNotBuilt`].
//!
//! ```
//! use pipewright_schedule::{Action, ActionKind, Event, Timeline, TimelineMeta, TimelineSource};
//! use pipewright_viz::{bubble_chart, terminal_chart, ChartOptions, ChartPanel, ImageFormat};
//!
//! // Two devices, one microbatch: F on device 0, then F and B on device 1, then B on device 0.
//! let ev = |device, stage, kind, start, end| Event {
//!     device, action: Action::new(stage, kind, 0), start, end,
//! };
//! let tl = Timeline {
//!     meta: TimelineMeta {
//!         schedule: "1f1b".into(), devices: 2, stages: 2, microbatches: 1,
//!         source: TimelineSource::Simulated, time_unit: "units".into(),
//!     },
//!     events: vec![
//!         ev(0, 0, ActionKind::F, 0.0, 1.0),
//!         ev(1, 1, ActionKind::F, 1.0, 2.0),
//!         ev(1, 1, ActionKind::B, 2.0, 4.0),
//!         ev(0, 0, ActionKind::B, 4.0, 6.0),
//!     ],
//! };
//! let svg = bubble_chart(&[ChartPanel::new(&tl)], &ChartOptions::default(), ImageFormat::Svg)?;
//! assert!(String::from_utf8(svg).unwrap().contains("<title>dev 0 0F0"));
//!
//! let text = terminal_chart(&tl, 60);
//! assert!(text.lines().all(|l| l.chars().count() <= 60));
//! assert_eq!(ImageFormat::from_path("chart.png".as_ref())?, ImageFormat::Png);
//! # Ok::<(), pipewright_viz::VizError>(())
//! ```
#![deny(missing_docs)]

mod bars;
#[cfg(feature = "png")]
mod bitmap;
mod bubble;
mod canvas;
mod dense;
mod error;
mod lanes;
mod layout;
mod memory;
mod pareto;
mod render;
mod style;
mod sweep;
mod term;
mod text;

use std::path::Path;

use pipewright_schedule::{MemorySample, Timeline};

pub use bars::{bubble_chart_with_memory, memory_bars, MemoryBars};
pub use error::VizError;
pub use pareto::{pareto_plot, ParetoPoint};
pub use sweep::{sweep_plot, SweepPoint, SweepSeries};
pub use term::{terminal_chart, MIN_COLUMNS as MIN_TERM_COLUMNS};

/// Image format of a chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// Scalable vector graphics; every action box carries a `<title>` such as `dev 0 0F3`.
    Svg,
    /// 8-bit RGB PNG (feature `png`; without it, [`VizError::PngNotBuilt`]).
    Png,
}

impl ImageFormat {
    /// Format from a file name's extension (`.svg` or `.png`, any case).
    pub fn from_path(path: &Path) -> Result<Self, VizError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(ImageFormat::Svg),
            Some("png") => Ok(ImageFormat::Png),
            _ => Err(VizError::UnknownExtension(path.to_path_buf())),
        }
    }
}

/// Size and labelling of a chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartOptions {
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels; `None` picks a height that fits the content at its natural
    /// size. A given height stretches or shrinks the rows to fit, down to a readable minimum
    /// ([`VizError::TooSmall`] below that).
    pub height: Option<u32>,
    /// Title; `None` writes the schedule(s) and their parameters.
    pub title: Option<String>,
    /// A memory budget in bytes, drawn as a dashed line on memory panels and on the sweep
    /// plot's memory panel.
    pub memory_cap: Option<u64>,
}

impl Default for ChartOptions {
    fn default() -> Self {
        ChartOptions {
            width: 1200,
            height: None,
            title: None,
            memory_cap: None,
        }
    }
}

/// One timeline to draw, with its optional memory track and label.
#[derive(Clone, Debug)]
pub struct ChartPanel<'a> {
    /// The timeline.
    pub timeline: &'a Timeline,
    /// Memory over time per device (index = device), drawn as a panel under the rows.
    pub memory: Option<&'a [Vec<MemorySample>]>,
    /// Panel heading; `None` uses `schedule (v=…)`.
    pub label: Option<String>,
}

impl<'a> ChartPanel<'a> {
    /// A panel of `timeline` with no memory track and the default label.
    pub fn new(timeline: &'a Timeline) -> Self {
        ChartPanel {
            timeline,
            memory: None,
            label: None,
        }
    }

    /// Add a memory track (index = device).
    pub fn with_memory(mut self, memory: &'a [Vec<MemorySample>]) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Set the panel's heading.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }
}

/// Whether a timeline can be drawn on a time axis: an empty one can (an empty chart), one
/// whose events all take no time cannot ([`VizError::ZeroSpan`]), since every box would be
/// zero pixels wide and the chart would look like an idle step.
pub fn drawable(tl: &Timeline) -> Result<(), VizError> {
    if !tl.events.is_empty() && tl.makespan() - tl.start() <= 0.0 {
        return Err(VizError::ZeroSpan(tl.meta.schedule.clone()));
    }
    Ok(())
}

/// Draw a bubble chart: one panel is a single chart, several are stacked on one shared time
/// axis (each aligned at its own start) for comparison. Returns the image's bytes.
///
/// Boxes narrower than a pixel are merged with same-coloured neighbours less than half a
/// pixel away; a merged box spans exactly its actions, so nothing moves.
pub fn bubble_chart(
    panels: &[ChartPanel<'_>],
    opts: &ChartOptions,
    fmt: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    if panels.is_empty() {
        return Err(VizError::NoPanels);
    }
    text::ensure_fonts()?;
    let data = panels
        .iter()
        .map(layout::PanelData::new)
        .collect::<Result<Vec<_>, _>>()?;
    let lay = layout::Layout::new(&data, opts)?;
    let draw = |c: &mut dyn canvas::Canvas| bubble::draw_chart(c, &data, &lay, opts);
    render::render(fmt, lay.width, lay.height, draw)
}
