//! `Chart`: an image from the viz crate, shown inline by Jupyter through its `_repr_*_`.

use pipewright_schedule::Timeline as RsTimeline;
use pipewright_viz::{bubble_chart, ChartOptions, ChartPanel, ImageFormat};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::err;

/// An image: SVG or PNG bytes. In a notebook it shows as itself.
#[pyclass(module = "pipewright", frozen)]
pub struct Chart {
    bytes: Vec<u8>,
    format: ImageFormat,
}

impl Chart {
    pub(crate) fn new(bytes: Vec<u8>, format: ImageFormat) -> Self {
        Chart { bytes, format }
    }

    pub(crate) fn svg_text(&self) -> PyResult<String> {
        match self.format {
            ImageFormat::Svg => String::from_utf8(self.bytes.clone()).map_err(err),
            ImageFormat::Png => Err(err("this chart is a PNG, not an SVG")),
        }
    }
}

#[pymethods]
impl Chart {
    /// The image's bytes.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    /// `"svg"` or `"png"`.
    #[getter]
    fn format(&self) -> &'static str {
        match self.format {
            ImageFormat::Svg => "svg",
            ImageFormat::Png => "png",
        }
    }

    /// Write the image to `path` (its extension must match the format).
    fn save(&self, path: std::path::PathBuf) -> PyResult<()> {
        let want = ImageFormat::from_path(&path).map_err(err)?;
        if want != self.format {
            return Err(err(format!(
                "{}: this chart is {}; draw it with format={:?} or use a .{} file name",
                path.display(),
                self.format(),
                if want == ImageFormat::Svg {
                    "svg"
                } else {
                    "png"
                },
                self.format()
            )));
        }
        crate::timetable::write_atomic(&path, &self.bytes)
    }

    fn _repr_svg_(&self) -> Option<String> {
        self.svg_text().ok()
    }

    fn _repr_png_<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        (self.format == ImageFormat::Png).then(|| PyBytes::new(py, &self.bytes))
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Chart(format={:?}, bytes={})",
            self.format(),
            self.bytes.len()
        )
    }
}

pub(crate) fn image_format(format: &str) -> PyResult<ImageFormat> {
    match format.to_ascii_lowercase().as_str() {
        "svg" => Ok(ImageFormat::Svg),
        "png" => Ok(ImageFormat::Png),
        _ => Err(err(format!("format `{format}`: use svg or png"))),
    }
}

/// Draw timelines (with optional labels) stacked on one time axis.
pub(crate) fn draw(
    panels: &[(&RsTimeline, Option<String>)],
    format: &str,
    width: u32,
    height: Option<u32>,
    title: Option<String>,
) -> PyResult<Chart> {
    let fmt = image_format(format)?;
    let panels: Vec<ChartPanel<'_>> = panels
        .iter()
        .map(|(tl, label)| {
            let p = ChartPanel::new(tl);
            match label {
                Some(l) => p.with_label(l.clone()),
                None => p,
            }
        })
        .collect();
    let opts = ChartOptions {
        width,
        height,
        title,
        ..ChartOptions::default()
    };
    Ok(Chart::new(
        bubble_chart(&panels, &opts, fmt).map_err(err)?,
        fmt,
    ))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Chart>()?;
    Ok(())
}
