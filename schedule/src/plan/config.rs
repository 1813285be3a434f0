//! A parallel configuration, what a user fixes of it, and the request a plan answers.

use serde::{Deserialize, Serialize};

use super::cluster::{Cluster, Precision};
use crate::memory::ModelShape;
use crate::recompute::Recompute;
use crate::spec::ScheduleKind;

/// One way to run the model: every dimension the plan chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    /// Tensor-parallel ranks per stage.
    pub tp: u32,
    /// Pipeline devices.
    pub pp: u32,
    /// Data-parallel replicas.
    pub dp: u32,
    /// Model chunks per pipeline device.
    pub v: u32,
    /// Sequences per microbatch.
    pub microbatch_size: u64,
    /// Microbatches per step per replica.
    pub microbatches: u32,
    /// Schedule family.
    pub schedule: ScheduleKind,
    /// Recomputation of every stage.
    pub recompute: Recompute,
    /// ZeRO level (0 or 1).
    pub zero: u8,
    /// Sequence parallelism in the TP group.
    pub sequence_parallel: bool,
}

impl Config {
    /// Pipeline stages `pp * v`.
    pub fn stages(&self) -> u32 {
        self.pp * self.v
    }

    /// GPUs used.
    pub fn gpus(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.dp)
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tp {} pp {} dp {} {} v {} mbs {} m {} recompute {} zero {}{}",
            self.tp,
            self.pp,
            self.dp,
            self.schedule,
            self.v,
            self.microbatch_size,
            self.microbatches,
            self.recompute,
            self.zero,
            if self.sequence_parallel { " sp" } else { "" }
        )
    }
}

/// The dimensions a user fixed by hand; `None` leaves one to the search.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fixed {
    /// Tensor-parallel ranks.
    pub tp: Option<u32>,
    /// Pipeline devices.
    pub pp: Option<u32>,
    /// Chunks per device.
    pub v: Option<u32>,
    /// Sequences per microbatch.
    pub microbatch_size: Option<u64>,
    /// Schedule family.
    pub schedule: Option<ScheduleKind>,
    /// Recomputation.
    pub recompute: Option<Recompute>,
    /// ZeRO level.
    pub zero: Option<u8>,
    /// Sequence parallelism.
    pub sequence_parallel: Option<bool>,
}

/// What a plan is asked: a model, a cluster, how many GPUs, the batch, and what is fixed.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest {
    /// The model.
    pub shape: ModelShape,
    /// The cluster.
    pub cluster: Cluster,
    /// GPUs to use (all of them: `tp * pp * dp = gpus`).
    pub gpus: u32,
    /// Sequences per training step.
    pub global_batch: u64,
    /// Number format.
    pub precision: Precision,
    /// Dimensions fixed by hand.
    pub fixed: Fixed,
    /// Let TP groups span nodes (over the inter-node link).
    pub allow_cross_node_tp: bool,
    /// Largest chunks per device tried for the loop families.
    pub max_virtual: u32,
    /// Largest microbatch size tried.
    pub max_microbatch_size: u64,
    /// Configurations simulated with the event simulator at most (the rest are ranked by
    /// their closed-form bound only and never reported).
    pub max_simulated: usize,
    /// Rows of the ranking to keep.
    pub top: usize,
}

impl PlanRequest {
    /// A request with the defaults: v up to 8, microbatches of up to 16 sequences, 48
    /// simulations, top 10.
    pub fn new(shape: ModelShape, cluster: Cluster, gpus: u32, global_batch: u64) -> Self {
        PlanRequest {
            shape,
            cluster,
            gpus,
            global_batch,
            precision: Precision::Bf16,
            fixed: Fixed::default(),
            allow_cross_node_tp: false,
            max_virtual: 8,
            max_microbatch_size: 16,
            max_simulated: 200,
            top: 10,
        }
    }
}
