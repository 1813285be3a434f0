//! Text forms: PyTorch's pipelining CSV and Chrome trace (Perfetto) JSON. Serde JSON of every
//! type comes from its `Serialize`/`Deserialize` derive.

mod chrome;
mod csv;

pub use chrome::chrome_trace;
pub use csv::{from_csv, to_csv, CsvError, CsvSource};
