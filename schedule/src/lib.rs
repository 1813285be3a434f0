//! Pipeline-parallel schedules as data.
//!
//! A *timetable* says, for each device, which actions it runs and in what order: forwards
//! (`F`), backwards (`B`, or split into input-gradient `I` and weight-gradient `W`) on
//! (stage, microbatch) pairs, and, once [`lower`]ed, the sends and receives between devices.
//! This crate makes timetables ([`generate`]), checks them ([`validate()`]), and predicts how
//! they run with real durations ([`simulate()`]). It knows nothing of async, threads or GPUs:
//! every function here is pure, so everything can be tested anywhere in milliseconds.
//!
//! The pipeline, end to end:
//!
//! ```
//! use pipewright_schedule::{generate, lower, simulate, validate, CostModel, ScheduleKind,
//!     ScheduleSpec, StageCost};
//!
//! // 4 devices, 2 model chunks each, 8 microbatches: Megatron's interleaved 1F1B.
//! let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 2, 8, None)?;
//! let timetable = generate(&spec);
//! let lowered = lower(&timetable)?;          // adds SEND_F, RECV_F, SEND_B, RECV_B
//! assert!(validate(&lowered)?.lowered);     // complete, ordered, paired, deadlock-free
//!
//! // Each chunk: forward 1, backward 2 time units; no communication cost.
//! let costs = CostModel::uniform(spec.stages(), StageCost::new(1.0, 2.0, None)?);
//! let sim = simulate(&lowered, &costs)?;
//! // The closed form of interleaving: bubble = (p-1)/(v*m+p-1) = 3/19.
//! assert!((sim.report.bubble_fraction - 3.0 / 19.0).abs() < 1e-12);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod action;
pub mod cancel;
pub mod formats;
pub mod generators;
pub mod layer_profile;
pub mod memory;
pub mod plan;
pub mod recompute;
pub mod search;
pub mod shape;
pub mod simulate;
pub mod spec;
pub mod sweep;
pub mod timeline;
pub mod timetable;
pub mod validate;

pub use action::{Action, ActionKind, ParseActionError};
pub use cancel::Cancel;
pub use formats::{
    chrome_trace, from_csv, to_csv, write_csv, CsvError, CsvForm, CsvSource, PytorchError,
};
pub use generators::generate;
pub use layer_profile::{LayerProfile, ProfileError, RawLayerProfile};
pub use recompute::{Recompute, RecomputeError, RecomputePlan};
pub use simulate::{
    measured_costs, simulate, CostError, CostModel, DeviceReport, RawCostFile, RawStageCost,
    Report, SimError, Simulation, StageCost,
};
pub use spec::{Placement, RawSpec, ScheduleKind, ScheduleSpec, SpecError};
pub use sweep::{best, parse_counts, sweep, CountsError, SweepGrid, SweepRow};
pub use timeline::{
    same_pipeline, Event, MemorySample, OtherPipeline, Timeline, TimelineError, TimelineMeta,
    TimelineSource,
};
pub use timetable::{lower, LowerError, Timetable};
pub use validate::{validate, validate_with, Problem, Semantics, Validated, ValidationError};
