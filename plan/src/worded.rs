//! A line that names fields, kept unwritten until a face writes them its way: the CLI's
//! `--tp 4`, Python's `tp=4` (see [`pipewright_model::shape::request::FieldName`]).

use std::fmt;
use std::sync::Arc;

use pipewright_model::shape::request::{flag_form, FieldName};

/// Writes a line with each field as the given [`FieldName`] writes it.
type Writer = dyn for<'a> Fn(FieldName<'a>) -> String + Send + Sync;

/// A line naming fields; `Display` is the command line's words.
#[derive(Clone)]
pub struct Worded(Arc<Writer>);

impl Worded {
    /// The line `write` gives for a face's way of writing fields.
    pub fn new(write: impl for<'a> Fn(FieldName<'a>) -> String + Send + Sync + 'static) -> Self {
        Worded(Arc::new(write))
    }

    /// A line that names no field.
    pub fn plain(line: String) -> Self {
        Worded::new(move |_| line.clone())
    }

    /// The line with each field written as `name` writes it.
    pub fn named(&self, name: FieldName<'_>) -> String {
        (self.0)(name)
    }
}

impl fmt::Display for Worded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.named(&flag_form))
    }
}

impl fmt::Debug for Worded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Worded({:?})", self.to_string())
    }
}

/// JSON (`plan --format json`) holds the command line's words.
impl serde::Serialize for Worded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Two lines are the same when the command line's words are.
impl PartialEq for Worded {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

/// `field` with `value`, as `name` writes it.
pub fn with(name: FieldName<'_>, field: &str, value: impl fmt::Display) -> String {
    name(field, Some(value.to_string()))
}
