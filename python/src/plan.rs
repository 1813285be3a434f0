//! `plan`: the whole parallel configuration for a GPT on a cluster.

use pyo3::prelude::*;

pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
