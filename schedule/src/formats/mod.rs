//! Text forms: PyTorch's pipelining CSV (compute-only and compute+comms, written and read,
//! and pipewright's own lowered rows) and Chrome trace (Perfetto) JSON. Serde JSON of every
//! type comes from its `Serialize`/`Deserialize` derive.

mod chrome;
mod comms;
mod csv;
pub mod pytorch;

pub use chrome::chrome_trace;
pub use csv::{from_csv, to_csv, CsvError, CsvSource};
pub use pytorch::{write_csv, CsvForm, PytorchError};
