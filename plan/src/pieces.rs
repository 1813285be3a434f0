//! What a configuration's time is made of, per layer and per stage, and the pieces every
//! model kind shares: the device's figures and the DP reduction with its optimizer step. The
//! GPT costing ([`super::costs`]) and the profile costing ([`super::layers`]) both build on it.

use super::cluster::Precision;
use super::comm::{all_reduce, reduce_scatter, Links};
use super::config::{Config, PlanRequest};
use super::moe_comm::Dispatcher;
use super::work::{Device, WorkTimes};

/// Per-layer and per-stage pieces of a configuration's costs, in seconds, kept apart so the
/// plan can bound, explain and attribute them.
#[derive(Clone, Debug, PartialEq)]
pub struct Pieces {
    /// One transformer layer's compute (no communication).
    pub layer: WorkTimes,
    /// One layer's TP communication in F (and again in I).
    pub layer_tp: f64,
    /// The LM head's compute.
    pub head: WorkTimes,
    /// The embedding's TP all-reduce (first stage, F).
    pub embed_tp: f64,
    /// Layers per stage.
    pub layers: Vec<u32>,
    /// Each layer's compute where the layers differ (a mixture's MoE and dense layers,
    /// latent attention: [`super::work_moe`]); `None`: every layer is `layer`.
    pub layer_work: Option<Vec<WorkTimes>>,
    /// Each stage's expert all-to-all per microbatch, `(forward, backward)` seconds
    /// ([`super::moe_comm::stage_all_to_all`]); empty for a dense model.
    pub all_to_all: Vec<(f64, f64)>,
}

impl Pieces {
    /// The compute of stage `s`'s layers, and of its first `k` alone.
    pub fn stage_layers_work(&self, s: u32, k: u32) -> (WorkTimes, WorkTimes) {
        let n = self.layers[s as usize];
        let Some(work) = &self.layer_work else {
            return (self.layer * f64::from(n), self.layer * f64::from(k.min(n)));
        };
        let start: u32 = self.layers[..s as usize].iter().sum();
        let sum = |to: u32| {
            work[start as usize..(start + to) as usize]
                .iter()
                .fold(WorkTimes::default(), |a, &b| a + b)
        };
        (sum(n), sum(k.min(n)))
    }
}

/// The device a configuration's work runs on.
pub fn device(req: &PlanRequest) -> Device {
    let peak = req.cluster.peak_flops(req.precision);
    let act_bytes = req.precision.activation_bytes() as f64;
    let fp8 = req.fp8.then(|| req.cluster.fp8_flops()).flatten();
    Device {
        peak,
        linear_peak: fp8.unwrap_or(peak),
        hbm: req.cluster.memory_bandwidth(),
        efficiency: req.cluster.efficiency,
        act_bytes,
        cast_bytes: if fp8.is_some() { act_bytes + 1.0 } else { 0.0 },
        dispatch_fp8: fp8.is_some() && req.dispatcher == Dispatcher::DeepEp,
    }
}

/// The DP gradient reduction and optimizer step (ZeRO-1's all-gather included) of a stage
/// of `params` parameters per rank whose weights are kept in `precision` (f32 gradients and
/// moments either way).
pub(super) fn data_parallel(
    req: &PlanRequest,
    cfg: &Config,
    links: &Links,
    params: f64,
    precision: Precision,
) -> (f64, f64) {
    let grads = 4.0 * params;
    let param_bytes = precision.activation_bytes() as f64;
    let moved = match precision {
        Precision::Bf16 => 30.0,
        Precision::Tf32 | Precision::F32 => 28.0,
    };
    let hbm = req.cluster.memory_bandwidth();
    if cfg.zero >= 1 && cfg.dp > 1 {
        let dp = f64::from(cfg.dp);
        let step = moved * params / dp / hbm;
        let gather = reduce_scatter(&links.dp, cfg.dp, param_bytes * params);
        (reduce_scatter(&links.dp, cfg.dp, grads), step + gather)
    } else {
        (all_reduce(&links.dp, cfg.dp, grads), moved * params / hbm)
    }
}
