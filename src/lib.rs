//! pipewright: pipeline-parallel training with schedules that are data.
//!
//! The one crate to depend on: `schedule` (timetables, validator, simulator, planner), with
//! `model`, `sim`, `search` and `plan` also by their own crates' names, `runtime` (meshes, the
//! per-device runtime, `StageModule` and layer lists), `kernels` (tensors, layers with split
//! backward, optimizers), `viz` (bubble charts), `input` (files read within this machine's
//! limits, timelines checked on the way in) and `calibrate` (this machine measured as a
//! cluster for the planner). Links are left out: which modules exist depends on the features.
//! Cargo features `mpi`, `cuda`, `nccl` and `candle` turn on the runtime's transports and
//! bridges. `prelude` holds what a model needs.
//!
//! `sim`, `search`, `plan`, `runtime` (with `kernels` and `prelude`), `viz`, `png` (PNG
//! charts; SVG needs only `viz`), `input` and `calibrate` are default features, and a cold
//! build skips what is left out. With `default-features = false` this crate is the core and
//! model shapes and memory; a crate that simulates timetables adds `features = ["sim"]`, and one
//! that trains a model and draws its chart as SVG takes `features = ["runtime", "viz"]`.
#![deny(missing_docs)]

#[cfg(feature = "calibrate")]
pub use pipewright_calibrate as calibrate;
#[cfg(feature = "input")]
pub use pipewright_input as input;
#[cfg(feature = "runtime")]
pub use pipewright_kernels as kernels;
pub use pipewright_model as model;
#[cfg(feature = "plan")]
pub use pipewright_plan as plan;
#[cfg(feature = "runtime")]
pub use pipewright_runtime as runtime;
#[cfg(feature = "search")]
pub use pipewright_search as search;

/// The simulator (`pipewright-sim`), with the search and sweeps (`pipewright-search`) under
/// the paths they had when one crate held them.
#[cfg(feature = "sim")]
pub mod sim {
    /// The search for the fastest timetable under a memory cap (`pipewright-search`).
    #[cfg(feature = "search")]
    pub use pipewright_search as search;
    #[cfg(feature = "search")]
    pub use pipewright_search::{
        best, parse_counts, sweep, CountsError, SweepGrid, SweepRequest, SweepRequestError,
        SweepRow,
    };
    pub use pipewright_sim::*;
}

/// The schedule side in one place, as it was before it became four crates: the core
/// (`pipewright-schedule`), model shapes and memory (`pipewright-model`), the simulator,
/// sweep and search (`pipewright-sim`, `pipewright-search`), and the planner
/// (`pipewright-plan`, as `plan`). Every path a user wrote against `pipewright::schedule`
/// keeps working on the default features; the simulator's, search's and planner's need the
/// features `sim`, `search` and `plan`.
pub mod schedule {
    pub use pipewright_model::{
        layer_profile, memory, shape, LayerProfile, ProfileError, RawLayerProfile,
    };
    #[cfg(feature = "plan")]
    pub use pipewright_plan as plan;
    pub use pipewright_schedule::*;
    /// The search for the fastest timetable under a memory cap (`pipewright-search`).
    #[cfg(feature = "search")]
    pub use pipewright_search as search;
    #[cfg(feature = "search")]
    pub use pipewright_search::{best, parse_counts, sweep, CountsError, SweepGrid, SweepRow};
    #[cfg(feature = "sim")]
    pub use pipewright_sim::{
        measured_costs, simulate, CostError, CostModel, DeviceReport, RawCostFile, RawStageCost,
        Report, SimError, Simulation, StageCost,
    };
}
#[cfg(feature = "viz")]
pub use pipewright_viz as viz;

/// What a model trained through pipewright uses, in one import: `use pipewright::prelude::*;`.
#[cfg(feature = "runtime")]
pub mod prelude {
    pub use pipewright_kernels::layers::{
        Embedding, LayerNorm, Linear, Mlp, MlpKind, NoTp, Param, Parameters, RmsNorm, TpReduce,
        TpShard,
    };
    pub use pipewright_kernels::optim::AdamWConfig;
    pub use pipewright_kernels::{Footprint, Tensor};
    pub use pipewright_runtime::host::{self, HostAdamW};
    pub use pipewright_runtime::split::{cut, Balance, BoxedLayer, Layer, LayerStage, TpLayout};
    pub use pipewright_runtime::{
        run, Coord, FinalParams, Mesh, MicrobatchData, MicrobatchId, ModuleError, Output,
        ParamName, RunOptions, RuntimeError, StageModule, StepRecord,
    };
    pub use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec, Timetable};
}

// Every Rust block of the README and of GUIDE.md compiles and runs as a doctest
// (`cargo test --doc`). They need `runtime` and `viz` alone, the features GUIDE's example
// names, and CI runs them on just those.
#[cfg(all(doctest, feature = "runtime", feature = "viz"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(all(doctest, feature = "runtime", feature = "viz"))]
#[doc = include_str!("../GUIDE.md")]
pub struct GuideDoctests;
