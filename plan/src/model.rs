//! The model a plan is for: a GPT's shape (costed from its FLOPs and the cluster's curve,
//! its memory from the published formulas), or a layer-list profile (costed and sized from
//! what was measured, [`super::layers`]). The few places that differ dispatch here.

use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::ModelShape;
use pipewright_model::shape::AttentionKind;
use pipewright_schedule::recompute::Recompute;

use super::config::Config;
use super::work::{layer_flops, model_flops};

/// A GPT-like decoder, or a user's list of layers as profiled.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanModel {
    /// A GPT of this shape; the global batch is in sequences.
    Gpt(ModelShape),
    /// A layer-list model as measured on one device; the global batch is in samples. It runs
    /// without tensor parallelism (tp 1, no SP) and recomputes fully or not at all.
    Layers(LayerProfile),
}

impl PlanModel {
    /// The GPT's shape, if it is one.
    pub fn gpt(&self) -> Option<&ModelShape> {
        match self {
            PlanModel::Gpt(s) => Some(s),
            PlanModel::Layers(_) => None,
        }
    }

    /// The profile, if it is one.
    pub fn profile(&self) -> Option<&LayerProfile> {
        match self {
            PlanModel::Gpt(_) => None,
            PlanModel::Layers(p) => Some(p),
        }
    }

    /// Layers that stages cut (transformer blocks, or the list's layers).
    pub fn layers(&self) -> u32 {
        match self {
            PlanModel::Gpt(s) => s.layers,
            PlanModel::Layers(p) => u32::try_from(p.len()).unwrap_or(u32::MAX),
        }
    }

    /// What the global batch counts.
    pub fn batch_unit(&self) -> &'static str {
        match self {
            PlanModel::Gpt(_) => "sequences",
            PlanModel::Layers(_) => "samples",
        }
    }

    /// Tokens in `samples` (a GPT's sequences times their length); `None` for a profile.
    pub fn tokens(&self, samples: f64) -> Option<f64> {
        self.gpt().map(|s| samples * s.seq_len as f64)
    }

    /// Model FLOPs of one step of `samples` (3x the forward, no recomputation); for a
    /// profile only where it gives each layer's FLOPs.
    pub fn model_flops(&self, samples: f64) -> Option<f64> {
        match self {
            PlanModel::Gpt(s) => Some(model_flops(s, samples)),
            PlanModel::Layers(p) => {
                let per_sample = p.forward_flops()? / p.microbatch_size as f64;
                Some(3.0 * per_sample * samples)
            }
        }
    }

    /// Hardware FLOPs of one step of `samples` as Narayanan et al. count them: the model's,
    /// plus the recomputed forward (all of it under full recomputation; under selective, the
    /// attention core's `4bs^2h` per layer where attention is materialized, and no matmul
    /// where it is fused, whose selective recomputation is element-wise).
    pub fn hardware_flops(
        &self,
        cfg: &Config,
        attention: AttentionKind,
        samples: f64,
    ) -> Option<f64> {
        let model = self.model_flops(samples)?;
        let extra = match self {
            PlanModel::Gpt(shape) => {
                let layers = f64::from(cfg.recomputed_layers(shape.layers));
                match cfg.recompute {
                    Recompute::None => 0.0,
                    Recompute::Full | Recompute::Every(_) => layers * layer_flops(shape, samples),
                    Recompute::Selective if attention == AttentionKind::Fused => 0.0,
                    Recompute::Selective => {
                        layers
                            * 4.0
                            * samples
                            * (shape.seq_len as f64).powi(2)
                            * shape.d_model as f64
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
}
