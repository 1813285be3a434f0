//! Why costs are unusable: one line each, naming the stage or field and the cost.

use std::fmt;

use pipewright_model::shape::request::flag_form;

/// Where a cost was given: a face's field (`cost`, `w_memory`: the CLI's `--cost`, Python's
/// `Costs`), or a place in words (`stage 3` of a cost file, `measured costs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// A field of the request.
    Field(&'static str),
    /// A place in words.
    Words(String),
}

impl Place {
    /// The place with a field written as `name` writes it.
    pub fn named(&self, name: &dyn Fn(&str) -> String) -> String {
        match self {
            Place::Field(field) => name(field),
            Place::Words(words) => words.clone(),
        }
    }
}

/// The command line's words: a field as its flag.
impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.named(&|field| flag_form(field, None)))
    }
}

/// Why costs are unusable; a field it names each face writes its way ([`CostError::named`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CostError {
    /// The cost file is not valid JSON for a cost file.
    #[error("cost file, line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde's message.
        message: String,
    },
    /// A needed cost is absent.
    #[error("{place}: no {what} given")]
    Missing {
        /// Which stage or field.
        place: Place,
        /// Which field.
        what: &'static str,
    },
    /// A negative or non-finite time of a stage or field.
    #[error("{place}: {what} must be a finite number >= 0 (got {value})")]
    InvalidAt {
        /// Which stage or field.
        place: Place,
        /// Which time.
        what: &'static str,
        /// The value.
        value: f64,
    },
    /// A negative or non-finite value.
    #[error("{what} must be a finite number >= 0 (got {value})")]
    Invalid {
        /// Which value.
        what: String,
        /// The value.
        value: f64,
    },
    /// W (or I) given larger than the full backward B it is part of.
    #[error("{place}: {part} = {value} is larger than b = {b}, but b is the whole backward and {part} a part of it (i + w = b): give {part} <= b")]
    PartOverWhole {
        /// Which stage or field.
        place: Place,
        /// `w` or `i`.
        part: &'static str,
        /// The part's value.
        value: f64,
        /// The full backward.
        b: f64,
    },
    /// `b`, `i` and `w` all given, with `i + w != b`, in costs of pipewright's runtime.
    #[error("{place}: i + w = {i} + {w} is not b = {b}: a split backward (I then W) does the fused backward's work, so give two of the three and the third follows (only a cost file measured in PyTorch's runtime, \"host\": {{\"runtime\": \"pytorch\"}}, times them apart)")]
    SplitMismatch {
        /// Which stage or field.
        place: Place,
        /// Input part.
        i: f64,
        /// Weight part.
        w: f64,
        /// The full backward.
        b: f64,
    },
    /// A split-backward probe of another pipeline than the steps it completes.
    #[error("the backward probe's steps are {probe}, but the recorded steps are {stages}: probe the same stages, timed the same way")]
    ProbeStages {
        /// The probe's stages, devices and time unit.
        probe: String,
        /// The recorded steps' stages, devices and time unit.
        stages: String,
    },
    /// A held-for-W fraction outside [0, 1].
    #[error("{place}: w_memory = {value} is not a fraction in [0, 1] (the part of a stage's activations still held after I until W: 1 = all, the default; the zero-bubble paper's transformer layer: 32h/(34h+5as), about 0.4)")]
    WMemory {
        /// Which stage or field.
        place: Place,
        /// The value given.
        value: f64,
    },
    /// Bandwidth must be positive.
    #[error("bandwidth must be a finite number > 0 bytes per time unit (got {0})")]
    Bandwidth(f64),
    /// The per-stage list neither divides nor is divided by the timetable's stages.
    #[error("cost file lists {given} stages, but the timetable has {stages} (one count must divide the other: the list is cut or joined evenly)")]
    StageCount {
        /// Entries given.
        given: usize,
        /// Stages in the timetable.
        stages: u32,
    },
    /// A per-stage list that neither divides nor is divided by the stages wanted.
    #[error("costs of {given} stages cannot be cut into {stages} stages (one count must divide the other)")]
    Resample {
        /// Stages in the cost model.
        given: u32,
        /// Stages wanted.
        stages: u32,
    },
    /// A step's times add up past what a number can hold.
    #[error("the costs of one step add up {} (each value is finite, their sum is not): give the costs in a larger unit", total_text(*total))]
    TimeTotal {
        /// The sum.
        total: f64,
    },
    /// A step's activation and hand-off bytes add up past 2^64.
    #[error("the activation and hand-off bytes of one step add up to {total:e}, past the 2^64 bytes a count can hold (each value fits, their sum does not): give smaller sizes")]
    BytesTotal {
        /// The sum.
        total: f64,
    },
    /// The model has fewer stage entries than the timetable has stages.
    #[error("the cost model has {given} stages, but the timetable has {stages}")]
    ModelStages {
        /// Entries in the model.
        given: usize,
        /// Stages in the timetable.
        stages: u32,
    },
}

impl CostError {
    /// The message with a field it names written as `name` writes it (`--cost` on the
    /// command line); `Display` is the command line's.
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        let line = self.to_string();
        match self {
            CostError::Missing { place, .. }
            | CostError::InvalidAt { place, .. }
            | CostError::PartOverWhole { place, .. }
            | CostError::SplitMismatch { place, .. }
            | CostError::WMemory { place, .. } => {
                // Each of these lines starts with its place and a colon.
                let rest = line.strip_prefix(&place.to_string()).unwrap_or(&line);
                format!("{}{rest}", place.named(&name))
            }
            _ => line,
        }
    }
}

/// A sum for an error line: its value, or that it overflowed.
fn total_text(total: f64) -> String {
    if total.is_finite() {
        format!("to {total:e} time units, past what the simulator can time")
    } else {
        "past the largest number the simulator can time".into()
    }
}
