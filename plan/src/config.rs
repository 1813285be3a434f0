//! A parallel configuration, what a user fixes of it, and the request a plan answers.

use serde::{Deserialize, Serialize};

use super::cluster::{Cluster, Precision};
use super::model::PlanModel;
use super::moe_comm::Dispatcher;
use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::ModelShape;
use pipewright_model::shape::AttentionKind;
use pipewright_schedule::recompute::{Recompute, RecomputePlan};
use pipewright_schedule::spec::ScheduleKind;

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
    /// Sequences (a profile's samples) per microbatch.
    pub microbatch_size: u64,
    /// Microbatches per step per replica.
    pub microbatches: u32,
    /// Schedule family.
    pub schedule: ScheduleKind,
    /// Recomputation, of the stages on the first `recompute_devices` pipeline devices.
    pub recompute: Recompute,
    /// Pipeline devices, from the first, whose stages recompute (`pp`: all of them). The
    /// first devices of 1F1B-like schedules hold the most microbatches, so recomputing there
    /// alone can be enough, and the later devices then save the recompute's time.
    pub recompute_devices: u32,
    /// ZeRO level (0 or 1).
    pub zero: u8,
    /// Sequence parallelism in the TP group.
    pub sequence_parallel: bool,
    /// Expert parallelism, folded over a stage's `tp x dp` GPUs (1 for a dense model).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: u32,
    /// Expert tensor parallelism (1 for a dense model).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub etp: u32,
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
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

    /// The recompute policy of stage `s` (by its device under the schedule's placement).
    pub fn recompute_of(&self, s: u32) -> Recompute {
        let device = self.schedule.placement().device_of(s, self.pp);
        if device < self.recompute_devices {
            self.recompute
        } else {
            Recompute::None
        }
    }

    /// Every stage's policy, as `train --recompute` takes it (one policy for all, or per stage).
    pub fn recompute_plan(&self) -> RecomputePlan {
        if self.recompute_devices >= self.pp || self.recompute == Recompute::None {
            return RecomputePlan::uniform(self.recompute);
        }
        let stages = (0..self.stages())
            .filter(|&s| self.recompute_of(s) != Recompute::None)
            .map(|s| (s, self.recompute))
            .collect();
        RecomputePlan {
            all: Recompute::None,
            stages,
        }
    }

    /// Transformer layers that recompute, of `layers` cut over the stages: every layer of a
    /// recomputing stage, or under `every:k` its first `k`.
    pub fn recomputed_layers(&self, layers: u32) -> u32 {
        let cuts = layers_per_stage(layers, self.stages());
        let rerun = |s: u32| match self.recompute_of(s) {
            Recompute::None => 0,
            Recompute::Every(k) => k.min(cuts[s as usize]),
            _ => cuts[s as usize],
        };
        (0..self.stages()).map(rerun).sum()
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tp {} pp {} dp {} {} v {} mbs {} m {} recompute {}{} zero {}{}",
            self.tp,
            self.pp,
            self.dp,
            self.schedule,
            self.v,
            self.microbatch_size,
            self.microbatches,
            self.recompute,
            match self.recompute_devices {
                _ if self.recompute == Recompute::None => String::new(),
                k if k >= self.pp => String::new(),
                1 => " on dev 0".to_string(),
                k => format!(" on dev 0-{}", k - 1),
            },
            self.zero,
            if self.sequence_parallel { " sp" } else { "" }
        )?;
        // A dense configuration's line is as it was; a mixture's names its expert layout.
        if self.ep > 1 || self.etp > 1 {
            write!(f, " ep {}", self.ep)?;
        }
        if self.etp > 1 {
            write!(f, " etp {}", self.etp)?;
        }
        Ok(())
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
    /// Expert parallelism.
    #[serde(default)]
    pub ep: Option<u32>,
    /// Expert tensor parallelism.
    #[serde(default)]
    pub etp: Option<u32>,
}

/// What a plan is asked: a model, a cluster, how many GPUs, the batch, and what is fixed.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest {
    /// The model.
    pub model: PlanModel,
    /// The cluster.
    pub cluster: Cluster,
    /// GPUs to use (all of them: `tp * pp * dp = gpus`).
    pub gpus: u32,
    /// Sequences (a profile's samples) per training step.
    pub global_batch: u64,
    /// Number format.
    pub precision: Precision,
    /// How the run computes attention, read by the time model (whether the `s x s` scores
    /// move through HBM) and the memory model (what a layer keeps, what selective
    /// recomputation drops). [`PlanRequest::new`] takes the cluster's
    /// ([`super::Efficiency::fused_attention`]); a request may say otherwise.
    pub attention: AttentionKind,
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
    /// Shapes of the ranking (tp, pp, dp, microbatch size and count) searched with
    /// `search`'s list scheduler where `pp x m` permits ([`super::listed`]); 0 searches none.
    pub max_searched: usize,
    /// A mixture's capacity factor (at least 1): the tokens an expert rank receives over the
    /// even share, in both memory and time; 1 for even routing.
    pub capacity_factor: f64,
    /// How a mixture's tokens reach their experts (the all-to-all's volume and links).
    pub dispatcher: Dispatcher,
    /// The linear layers' GEMMs (projections, MLPs, experts) in FP8 at the cluster's FP8
    /// peak, with their quantization passes, as DeepSeek-V3 and Transformer Engine run them;
    /// under DeepEP the dispatch moves FP8 too. Activations are kept in bf16 either way, so
    /// memory is as without it.
    pub fp8: bool,
}

impl PlanRequest {
    /// A request with the defaults: v up to 8, microbatches of up to 16 sequences, 200
    /// simulations, top 10, 2 shapes searched.
    pub fn new(shape: ModelShape, cluster: Cluster, gpus: u32, global_batch: u64) -> Self {
        Self::of(PlanModel::Gpt(shape), cluster, gpus, global_batch)
    }

    /// A request for a layer-list model as profiled, `global_batch` in samples; the same
    /// defaults, except that microbatches are of the profile's size unless fixed.
    pub fn from_profile(
        profile: LayerProfile,
        cluster: Cluster,
        gpus: u32,
        global_batch: u64,
    ) -> Self {
        Self::of(PlanModel::Layers(profile), cluster, gpus, global_batch)
    }

    fn of(model: PlanModel, cluster: Cluster, gpus: u32, global_batch: u64) -> Self {
        let attention = if cluster.efficiency.fused_attention {
            AttentionKind::Fused
        } else {
            AttentionKind::Materialized
        };
        PlanRequest {
            model,
            cluster,
            gpus,
            global_batch,
            precision: Precision::Bf16,
            attention,
            fixed: Fixed::default(),
            allow_cross_node_tp: false,
            max_virtual: 8,
            max_microbatch_size: 16,
            max_simulated: 200,
            top: 10,
            max_searched: 2,
            capacity_factor: 1.0,
            dispatcher: Dispatcher::AllToAll,
            fp8: false,
        }
    }
}

/// Layers per stage, cut as `pipewright_kernels::gpt::partition` cuts them (the first
/// `layers % stages` stages one more).
pub fn layers_per_stage(layers: u32, stages: u32) -> Vec<u32> {
    let (base, extra) = (layers / stages, layers % stages);
    (0..stages).map(|s| base + u32::from(s < extra)).collect()
}
