//! Pipeline-parallel schedules as data.
//!
//! A *timetable* says, for each device, which actions it runs and in what order: forwards
//! (`F`), backwards (`B`, or split into input-gradient `I` and weight-gradient `W`) on
//! (stage, microbatch) pairs, and, once [`lower`]ed, the sends and receives between devices.
//! This crate makes timetables ([`generate`]), checks them ([`validate()`]; a [`Checked`] is
//! one that passed, the form every consumer takes), and reads and
//! writes them (PyTorch's CSV forms, JSON, Chrome traces). It knows nothing of costs, model
//! shapes, async, threads or GPUs: every function here is pure, so everything can be tested
//! anywhere in milliseconds. Timing them is `pipewright-sim`'s job.
//!
//! ```
//! use pipewright_schedule::{generate, lower, validate, ScheduleKind, ScheduleSpec};
//!
//! // 4 devices, 2 model chunks each, 8 microbatches: Megatron's interleaved 1F1B.
//! let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 2, 8, None)?;
//! let timetable = generate(&spec);
//! let lowered = lower(&timetable)?;          // adds SEND_F, RECV_F, SEND_B, RECV_B
//! assert!(validate(&lowered)?.lowered);     // complete, ordered, paired, deadlock-free
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod action;
pub mod cancel;
pub mod checked;
pub mod formats;
pub mod generators;
pub mod recompute;
pub mod spec;
pub mod stash;
pub mod timeline;
pub mod timetable;
pub mod validate;

pub use action::{Action, ActionKind, ParseActionError};
pub use cancel::Cancel;
pub use checked::Checked;
pub use formats::{
    chrome_trace, from_csv, to_csv, write_csv, CsvError, CsvForm, CsvSource, PytorchError,
};
pub use generators::generate;
pub use recompute::{Recompute, RecomputeError, RecomputePlan};
pub use spec::{Placement, RawSpec, ScheduleKind, ScheduleSpec, SpecError};
pub use timeline::{
    same_pipeline, Event, MemorySample, OtherPipeline, Timeline, TimelineError, TimelineMeta,
    TimelineSource,
};
pub use timetable::{lower, LowerError, Timetable};
pub use validate::{validate, validate_with, Problem, Semantics, Validated, ValidationError};
