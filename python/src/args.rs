//! Arguments converted with one clear refusal each: a number of the wrong type, or out of
//! the range its Rust type holds, raises `pipewright.ArgumentError` (a `PipewrightError` and
//! a `TypeError`) saying what was given and what is accepted. PyO3 notes which argument was
//! being converted (`while processing 'gpus'`), and `ArgumentError`'s message leads with
//! that name: `gpus: -8 is out of range: give a whole number from 0 to 4294967295`.
//!
//! Used through `#[pyo3(from_py_with = ...)]` on every numeric argument of the Python face,
//! so the functions' bodies keep their plain types.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

/// The class `ArgumentError`, defined in Python so that its message can carry the name PyO3
/// notes after the error is raised (a note is not part of `str(error)`).
const ARGUMENT_ERROR: &std::ffi::CStr = c"
class ArgumentError(PipewrightError, TypeError):
    '''An argument of the wrong type or out of range: the message names it and what is accepted.'''

    def __str__(self):
        text = super().__str__()
        for note in getattr(self, '__notes__', ()):
            if note.startswith(\"while processing '\") and note.endswith(\"'\"):
                return note[len(\"while processing '\"):-1] + ': ' + text
        return text
";

/// Define `ArgumentError` in the module `m`, beside `PipewrightError`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let globals = pyo3::types::PyDict::new(py);
    globals.set_item("PipewrightError", m.getattr("PipewrightError")?)?;
    py.run(ARGUMENT_ERROR, Some(&globals), None)?;
    let class = globals.get_item("ArgumentError")?.ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err("ArgumentError was not defined")
    })?;
    class.setattr("__module__", "pipewright")?;
    m.add("ArgumentError", class)
}

/// An `ArgumentError` with `message`.
fn refuse(py: Python<'_>, message: String) -> PyErr {
    let class = py
        .import("pipewright._native")
        .and_then(|m| m.getattr("ArgumentError"));
    match class {
        Ok(class) => PyErr::from_value(match class.call1((message.clone(),)) {
            Ok(e) => e,
            Err(e) => return e,
        }),
        Err(e) => e,
    }
}

/// What was given, for the message: its type and a short repr.
fn given(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj
        .get_type()
        .name()
        .map_or_else(|_| "object".into(), |n| n.to_string());
    let repr = obj.repr().map_or_else(|_| "?".into(), |r| r.to_string());
    let repr = if repr.chars().count() > 40 {
        repr.chars().take(40).collect::<String>() + "…"
    } else {
        repr
    };
    format!("{ty} {repr}")
}

/// A Rust integer type's range, for messages.
pub(crate) trait Range: Sized + TryFrom<i128> {
    /// Smallest and largest value.
    const RANGE: (i128, i128);
}

macro_rules! range {
    ($($t:ty),*) => {$(
        impl Range for $t {
            const RANGE: (i128, i128) = (<$t>::MIN as i128, <$t>::MAX as i128);
        }
    )*};
}
range!(u8, u32, u64, usize);

/// A whole number in `T`'s range: an `int`, or what says it is one (`__index__`, as numpy's
/// integers do); not a `bool` (a flag), a `float` or a string.
pub(crate) fn whole<T: Range>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    let (lo, hi) = T::RANGE;
    let accepted = format!("give a whole number from {lo} to {hi}");
    let int = if obj.is_instance_of::<PyBool>() {
        None
    } else if obj.is_instance_of::<PyInt>() {
        Some(obj.clone())
    } else if obj.hasattr("__index__").unwrap_or(false) {
        obj.call_method0("__index__").ok()
    } else {
        None
    };
    let Some(int) = int else {
        let what = given(obj);
        return Err(refuse(
            obj.py(),
            format!("{what} is not a whole number: {accepted}"),
        ));
    };
    let out_of_range = || refuse(obj.py(), format!("{int} is out of range: {accepted}"));
    // Beyond i128 is out of every range too.
    let n: i128 = int.extract().map_err(|_| out_of_range())?;
    T::try_from(n).map_err(|_| out_of_range())
}

/// [`whole`], or None for None.
pub(crate) fn opt_whole<T: Range>(obj: &Bound<'_, PyAny>) -> PyResult<Option<T>> {
    if obj.is_none() {
        return Ok(None);
    }
    whole(obj).map(Some)
}

/// A list (any iterable) of whole numbers in `T`'s range.
pub(crate) fn wholes<T: Range>(obj: &Bound<'_, PyAny>) -> PyResult<Vec<T>> {
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<PyInt>() {
        return Err(refuse(
            obj.py(),
            format!("{} is not a list: give a list of whole numbers", given(obj)),
        ));
    }
    let items = obj.try_iter().map_err(|_| {
        refuse(
            obj.py(),
            format!("{} is not a list: give a list of whole numbers", given(obj)),
        )
    })?;
    items.map(|item| whole(&item?)).collect()
}

/// [`wholes`], or None for None.
pub(crate) fn opt_wholes<T: Range>(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<T>>> {
    if obj.is_none() {
        return Ok(None);
    }
    wholes(obj).map(Some)
}

/// A number: a `float`, an `int`, or what converts like one (numpy's scalars); not a
/// `bool` (a flag) or a string. Whether it is in range is the callee's to say (NaN and
/// infinities included), in its own words.
pub(crate) fn real(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    let number = obj.is_instance_of::<PyFloat>()
        || obj.is_instance_of::<PyInt>()
        || obj.hasattr("__index__").unwrap_or(false)
        || obj.hasattr("__float__").unwrap_or(false);
    if !number || obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyString>() {
        let what = given(obj);
        return Err(refuse(
            obj.py(),
            format!("{what} is not a number: give an int or a float"),
        ));
    }
    obj.extract()
        .map_err(|_| refuse(obj.py(), format!("{obj} is out of a float's range")))
}

/// [`real`], or None for None.
pub(crate) fn opt_real(obj: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    if obj.is_none() {
        return Ok(None);
    }
    real(obj).map(Some)
}
