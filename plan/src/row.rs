//! One row of the plan's ranking: a configuration with the figures the table and the JSON
//! show, computed once from its simulated step time and its memory.

use serde::Serialize;

use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::explain::{Limit, Terms};
use super::fit::worst;
use super::model::PlanModel;
use super::work::layer_flops;
use pipewright_model::memory::MemoryBreakdown;
use pipewright_model::shape::AttentionKind;
use pipewright_schedule::recompute::Recompute;
use pipewright_schedule::Checked;

/// One configuration of the ranking, with everything the table and the JSON show.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanRow {
    /// The configuration.
    pub config: Config,
    /// Predicted time per training step (steady-state period), seconds.
    pub step_time_s: f64,
    /// Tokens per second over the whole cluster (`None` for a profile, which has samples).
    pub tokens_per_s: Option<f64>,
    /// Sequences (a profile's samples) per second over the whole cluster.
    pub samples_per_s: f64,
    /// Achieved TFLOP/s per GPU as Narayanan et al. count them (recomputation included);
    /// `None` for a profile without FLOPs.
    pub tflops_per_gpu: Option<f64>,
    /// Model FLOPs utilisation: model FLOPs (no recomputation) over peak; `None` for a
    /// profile without FLOPs.
    pub mfu: Option<f64>,
    /// Peak memory of the fullest GPU, bytes.
    pub peak_memory_bytes: u64,
    /// GPU memory minus that peak (negative: does not fit).
    pub headroom_bytes: i64,
    /// Per pipeline device, the memory model's peak by category.
    pub memory: Vec<MemoryBreakdown>,
    /// Fraction of the step the busiest device idles in the schedule's bubble (after its
    /// compute, recomputation, TP collectives, exposed sends and DP reduction, optimizer).
    pub bubble: f64,
    /// The closed-form lower bound the search ordered it by, seconds.
    pub bound_s: f64,
    /// Where the step time goes (top rows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terms: Option<Terms>,
    /// What limits it (top rows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
    /// Set when its timetable came from `search`, not from its family's generator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched: Option<Box<Searched>>,
}

/// A row whose timetable came from the search, not from a generator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Searched {
    /// What made it, as `search` labels it (e.g. `list v=1 loop, I/W, cap 3.2`).
    pub label: String,
    /// The best fixed-family configuration of the same tp, pp, dp, microbatch size and count.
    pub fixed: Config,
    /// Its step time, seconds.
    pub fixed_step_s: f64,
    /// The timetable (compute actions, the recompute policy's `R`s written in).
    #[serde(skip)]
    pub timetable: Checked,
}

/// Hardware FLOPs of one step as Narayanan et al. count them (the model's, plus the recomputed
/// forward: all of it under full recomputation; under selective, the attention core's
/// `4bs^2h` per layer where attention is materialized, and no matmul where it is fused, whose
/// selective recomputation is element-wise), where known.
pub fn hardware_flops(req: &PlanRequest, cfg: &Config) -> Option<f64> {
    let samples = req.global_batch as f64;
    let model = req.model.model_flops(samples)?;
    let extra = match &req.model {
        PlanModel::Gpt(shape) => {
            let layers = f64::from(cfg.recomputed_layers(shape.layers));
            match cfg.recompute {
                Recompute::None => 0.0,
                Recompute::Full | Recompute::Every(_) => layers * mean_layer_flops(shape, samples),
                Recompute::Selective if req.attention == AttentionKind::Fused => 0.0,
                Recompute::Selective => {
                    layers * 4.0 * samples * (shape.seq_len as f64).powi(2) * shape.d_model as f64
                }
            }
        }
        PlanModel::Layers(p) => {
            let cuts = p.cuts(cfg.stages() as usize).unwrap_or_default();
            let rerun: f64 = (0..cuts.len())
                .filter(|&s| cfg.recompute_of(s as u32) != Recompute::None)
                .flat_map(|s| p.layers[cuts[s].clone()].iter())
                .filter_map(|l| l.flops)
                .sum();
            rerun / p.microbatch_size as f64 * samples
        }
    };
    Some(model + extra)
}

/// Forward FLOPs of a layer for `samples` sequences, the mean over the model's layers (a
/// uniform shape's every layer; a mixture's MoE and dense layers weighted by their counts).
fn mean_layer_flops(shape: &pipewright_model::shape::ModelShape, samples: f64) -> f64 {
    if shape.is_uniform() {
        return layer_flops(shape, samples);
    }
    let moe = f64::from(shape.moe_layers());
    let dense = f64::from(shape.layers) - moe;
    (dense * shape.layer_flops(false, samples) + moe * shape.layer_flops(true, samples))
        / f64::from(shape.layers)
}

pub(super) fn row(
    req: &PlanRequest,
    cfg: Config,
    step: f64,
    bound: f64,
    memory: Vec<MemoryBreakdown>,
) -> PlanRow {
    let gpus = f64::from(req.gpus);
    let peak_flops = req.cluster.peak_flops(req.precision);
    let samples = req.global_batch as f64;
    let (costs, _) = cost_model(req, &cfg);
    let ideal = f64::from(cfg.microbatches) * super::bound::busiest(&cfg, &costs).compute();
    let peak = worst(&memory);
    PlanRow {
        config: cfg,
        step_time_s: step,
        tokens_per_s: req.model.tokens(samples).map(|t| t / step),
        samples_per_s: samples / step,
        tflops_per_gpu: hardware_flops(req, &cfg).map(|f| f / step / gpus / 1e12),
        mfu: req
            .model
            .model_flops(samples)
            .map(|f| f / step / gpus / peak_flops),
        peak_memory_bytes: peak,
        headroom_bytes: req.cluster.memory_bytes() as i64 - peak as i64,
        memory,
        bubble: (1.0 - ideal / step).max(0.0),
        bound_s: bound,
        terms: None,
        limit: None,
        searched: None,
    }
}
