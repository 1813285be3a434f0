//! Memory by category: what one rank holds, predicted or measured, in bytes.
//!
//! [`MemoryBreakdown`] is the one shape both sides speak: the runtime measures it per rank and
//! step, and a prediction fills the same fields, so the two compare field by field.

mod breakdown;

pub use breakdown::MemoryBreakdown;
