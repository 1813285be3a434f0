//! The CSV forms a timetable is written in and read from: shared by the reader ([`super::csv`])
//! and the writer ([`super::pytorch`]).

/// Which CSV form to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CsvForm {
    /// PyTorch's compute-only form (`_load_csv`'s default, torchtitan's schedule CSV).
    ComputeOnly,
    /// PyTorch's compute+comms form (`_load_csv(format="compute_comms")`), waits included.
    ComputeComms,
    /// pipewright's own lowered rows: sends and receives placed by [`lower`](crate::lower),
    /// without waits. pipewright reads it; PyTorch does not.
    Lowered,
}

impl CsvForm {
    /// How the form is named in messages.
    pub const fn describe(self) -> &'static str {
        match self {
            CsvForm::ComputeOnly => "PyTorch's compute-only CSV",
            CsvForm::ComputeComms => "PyTorch's compute+comms CSV",
            CsvForm::Lowered => "pipewright's lowered CSV",
        }
    }
}
