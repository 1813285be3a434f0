//! Timetables timed: the discrete-event simulator for one step and for the steady state
//! ([`simulate`]), with its costs, reports and timelines. The search for the fastest timetable
//! under a memory cap and chunk-count sweeps are `pipewright-search`, built on this.
//!
//! ```
//! use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
//! use pipewright_sim::{simulate, CostModel, StageCost};
//!
//! // 4 devices, 2 model chunks each, 8 microbatches: Megatron's interleaved 1F1B.
//! let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 2, 8, None)?;
//! // Validated once; the simulator (like every consumer) takes it as `&Checked`.
//! let timetable = Checked::new(generate(&spec))?;
//! // Each chunk: forward 1, backward 2 time units; no communication cost.
//! let costs = CostModel::uniform(spec.stages(), StageCost::new(1.0, 2.0, None)?);
//! let sim = simulate(&timetable, &costs)?;
//! // The closed form of interleaving: bubble = (p-1)/(v*m+p-1) = 3/19.
//! assert!((sim.report.bubble_fraction - 3.0 / 19.0).abs() < 1e-12);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Invariants: no generator (it times what it is given, as a `Checked` timetable), no IO, no
//! async.
#![deny(missing_docs)]

pub mod simulate;

pub use simulate::{
    measured_costs, overlap_time, simulate, CostError, CostModel, DeviceReport, RawCostFile,
    RawStageCost, Report, SimError, Simulation, StageCost,
};
