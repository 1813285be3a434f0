//! `pipewright._native`: the Rust crates seen from Python. Every function here converts its
//! arguments, calls `pipewright-schedule` or `pipewright-viz`, and converts the answer back;
//! nothing is computed twice. Errors become `pipewright.PipewrightError` with the library's
//! own one-line message, the words the CLI prints after `error:` with each field written as
//! Python's keyword (`kv_heads=3`, see `shape::keyword`) where the CLI writes its flag.

use pipewright_schedule::timeline::MAX_DEVICES;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

mod args;
mod charts;
mod cli;
mod costs;
mod interrupt;
mod plan;
mod results;
mod search;
mod shape;
mod simulate;
mod timeline;
mod timetable;

create_exception!(
    pipewright,
    PipewrightError,
    PyValueError,
    "A request pipewright refuses, with the one line the CLI prints after `error:`, each field\n    written as the keyword passed (`kv_heads=3`) where the CLI writes its flag."
);

/// Any library error as a `PipewrightError` carrying its message.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    PipewrightError::new_err(e.to_string())
}

/// Python's hint for where a file of a kind is given ([`pipewright_input::Hint`]): the class
/// that reads the file, or `plan`'s keyword for it.
fn hint(field: &str) -> String {
    match field {
        "timetable" => "read it with Timetable.read".into(),
        "timeline" => "read it with Timeline.read".into(),
        "cost_file" => "read it with Costs.read".into(),
        f => format!("give it as {f}="),
    }
}

/// An input's refusal in Python's words: a file of another kind is named with [`hint`].
pub(crate) fn input_err(e: pipewright_input::InputError) -> PyErr {
    err(e.named(&hint))
}

/// A serde value as the Python object `json.loads` makes of it (dicts, lists, numbers).
pub(crate) fn to_py<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(err)?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// A Python object (a dict, a list, numbers) as JSON text, `json.dumps`'s: how a value handed
/// over from Python reaches serde (the reverse of [`to_py`]).
pub(crate) fn json_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    obj.py()
        .import("json")?
        .call_method1("dumps", (obj,))?
        .extract()
}

/// A text file's content, refused as the CLI refuses it (`pipewright_input::read_text`: the
/// same size limit, folders and devices, non-UTF-8 bytes, in the same words). The path is
/// the OS's (any bytes a file name may hold), not text.
pub(crate) fn read_file(path: &std::path::Path) -> PyResult<String> {
    pipewright_input::read_text(path).map_err(err)
}

/// A byte count as the CLI's byte flags take it: a whole number of bytes, or text with a
/// unit (`"1MiB"`, `"2.5GB"`), read by the schedule crate's one byte parser; errors name
/// the keyword.
pub(crate) fn byte_count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    let text = match value.extract::<String>() {
        Ok(s) => s,
        Err(_) => value.str()?.to_string(),
    };
    pipewright_search::parse_bytes(&text).map_err(|e| err(format!("{name}: {e}")))
}

/// Refuse a stage or device count no timetable can have, before anything is sized by it
/// (a per-stage cost list, a timetable): at least 1, devices at most a timeline's
/// [`MAX_DEVICES`], and stages this machine could hold a timetable of (`timetable_fits`,
/// the CLI's bound). Each pair is the argument's name and its value.
pub(crate) fn check_counts(stages: (&str, u32), devices: (&str, u32)) -> PyResult<()> {
    for (name, n) in [stages, devices] {
        if n == 0 {
            return Err(err(format!("{name} 0: give at least 1")));
        }
    }
    let (name, n) = devices;
    if n > MAX_DEVICES {
        return Err(err(format!("{name} {n}: give 1 to {MAX_DEVICES} devices")));
    }
    let (name, n) = stages;
    pipewright_input::timetable_fits(&format!("{name}={n}"), u64::from(n), 1).map_err(err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PipewrightError", m.py().get_type::<PipewrightError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    args::register(m)?;
    timetable::register(m)?;
    costs::register(m)?;
    timeline::register(m)?;
    simulate::register(m)?;
    charts::register(m)?;
    search::register(m)?;
    plan::register(m)?;
    results::register(m)?;
    shape::register(m)?;
    cli::register(m)?;
    Ok(())
}
