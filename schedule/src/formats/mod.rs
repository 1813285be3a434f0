//! Text forms: PyTorch's pipelining CSV (compute-only and compute+comms, written and read,
//! and pipewright's own lowered rows) and Chrome trace (Perfetto) JSON. Serde JSON of every
//! type comes from its `Serialize`/`Deserialize` derive.

mod chrome;
mod comms;
mod csv;
mod error;
mod form;
pub mod pytorch;

pub use chrome::chrome_trace;
pub use csv::{from_csv, to_csv, CsvError, CsvSource};
pub use pytorch::{write_csv, CsvForm, PytorchError};

/// serde_json's message without the " at line L column C" it appends: every reader of a JSON
/// file (costs, layer profiles, clusters) names the position its own way.
pub fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once(" at line ") {
        Some((message, _)) if e.line() > 0 => message.to_string(),
        _ => text,
    }
}
