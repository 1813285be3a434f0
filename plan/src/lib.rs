//! The plan: the whole parallel configuration (TP, PP, DP, schedule family and chunks,
//! microbatch size and count, recomputation, ZeRO-1, sequence parallelism) for a model on a
//! cluster, chosen by the memory model and the simulator.
//!
//! It composes the crate's pieces and adds no simulator of its own:
//! [`space`] lists the configurations a request allows; [`costs`] turns one into the
//! simulator's [`CostModel`](pipewright_sim::CostModel) from the cluster's figures ([`cluster`]), the
//! work of each layer ([`work`], [`efficiency`]) and its collectives ([`comm`]); [`bound`]
//! gives each a closed-form lower bound; [`search`] checks memory with
//! [`pipewright_model::memory::predict`] before anything is simulated, then simulates the survivors
//! in order of their bounds ([`evaluate`]: [`pipewright_sim::simulate::simulate_steps`]'s steady-state
//! period) until no bound can beat the best; [`explain`] says what limits each and why the
//! best won; [`listed`] adds `search`'s list scheduler as a family where sizes permit;
//! [`impossible`] says, in one line, the nearest thing that would work when
//! nothing does. [`request`] checks a request as a user gives it (the CLI's flags, Python's
//! keywords), and [`launch`] says what to run: the two faces share both, word for word.
//!
//! Invariants: no simulator and no memory model of its own (it composes
//! `pipewright-sim`'s and `pipewright-model`'s), and no IO beyond (de)serialisation.
#![deny(missing_docs)]

pub mod bound;
pub mod cluster;
pub mod comm;
pub mod config;
pub mod costs;
pub mod efficiency;
pub mod evaluate;
pub mod explain;
pub mod explain_moe;
pub mod fit;
pub mod impossible;
pub mod launch;
pub mod layers;
pub mod listed;
pub mod model;
pub mod moe_comm;
pub mod pieces;
pub mod rank;
pub mod refused;
pub mod request;
pub mod row;
pub mod search;
pub mod space;
pub mod worded;
pub mod work;
pub mod work_moe;

pub use cluster::{Cluster, Link, PeakTflops, Precision};
pub use config::{Config, Fixed, PlanRequest};
pub use efficiency::Efficiency;
pub use explain::{Limit, Terms};
pub use model::PlanModel;
pub use moe_comm::Dispatcher;
pub use request::{PlanRequestError, RawPlanRequest};
pub use row::PlanRow;
pub use search::{plan, Plan, Progress};

use pipewright_model::memory::MemoryError;
use pipewright_model::shape::request::FieldName;
use pipewright_schedule::spec::SpecError;
use pipewright_sim::simulate::{SimError, SteadyError};

/// Why a plan could not be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A cluster file that is not valid JSON for a cluster.
    #[error("cluster file, line {line}, column {column}: {message}")]
    ClusterFile {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde's message.
        message: String,
    },
    /// A cluster figure out of range.
    #[error("cluster: {what} must be a finite number > 0 (got {value})")]
    ClusterFigure {
        /// Which figure.
        what: &'static str,
        /// The value.
        value: f64,
    },
    /// A cluster figure outside what a real device can have ([`cluster::RANGES`]).
    #[error("cluster: {what} is {value}, outside {range}")]
    ClusterRange {
        /// Which figure.
        what: &'static str,
        /// The value.
        value: f64,
        /// The range, in words.
        range: &'static str,
    },
    /// Nothing can run: the one line saying the nearest thing that would, naming the
    /// request's fields ([`PlanError::named`]).
    #[error("{0}")]
    Impossible(worded::Worded),
    /// A schedule the plan built could not be made (a bug if it happens).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A simulation failed (a bug if it happens).
    #[error(transparent)]
    Steady(#[from] SteadyError),
    /// A simulation failed (a bug if it happens).
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The memory model refused a configuration.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A schedule search failed (a bug if it happens).
    #[error(transparent)]
    Search(#[from] pipewright_search::SearchError),
}

impl PlanError {
    /// The message with the request's fields written as `name` writes them (the CLI's
    /// `--tp 4`, Python's `tp=4`); `Display` is the command line's.
    pub fn named(&self, name: FieldName<'_>) -> String {
        match self {
            PlanError::Impossible(line) => line.named(name),
            e => e.to_string(),
        }
    }
}
