//! Sweep plot.
use crate::{ChartOptions, ImageFormat, VizError};
/// stub
pub struct SweepPoint;
/// stub
pub struct SweepSeries;
/// stub
pub fn sweep_plot(
    _s: &[SweepSeries],
    _o: &ChartOptions,
    _f: ImageFormat,
) -> Result<Vec<u8>, VizError> {
    Ok(vec![])
}
