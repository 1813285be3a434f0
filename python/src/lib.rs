//! `pipewright._native`: the Rust crates seen from Python. Every function here converts its
//! arguments, calls `pipewright-schedule` or `pipewright-viz`, and converts the answer back;
//! nothing is computed twice. Errors become `pipewright.PipewrightError` with the library's
//! own one-line message, the words the CLI prints after `error:`.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

mod charts;
mod costs;
mod plan;
mod search;
mod simulate;
mod timetable;

create_exception!(
    pipewright,
    PipewrightError,
    PyValueError,
    "A request pipewright refuses, with the one line the CLI prints after `error:`."
);

/// Any library error as a `PipewrightError` carrying its message.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    PipewrightError::new_err(e.to_string())
}

/// A serde value as the Python object `json.loads` makes of it (dicts, lists, numbers).
pub(crate) fn to_py<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(err)?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// Text from `str` or `bytes`-like arguments that name a file: read it, with the file in
/// the error like the CLI's.
pub(crate) fn read_file(path: &str) -> PyResult<String> {
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read {path}: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        err(format!(
            "{path} is not a text file (not UTF-8 at byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PipewrightError", m.py().get_type::<PipewrightError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    timetable::register(m)?;
    costs::register(m)?;
    simulate::register(m)?;
    charts::register(m)?;
    search::register(m)?;
    plan::register(m)?;
    Ok(())
}
