//! The model a plan is for: a GPT's shape (costed from its FLOPs and the cluster's curve,
//! its memory from the published formulas), or a layer-list profile (costed and sized from
//! what was measured, [`super::layers`]). The few places that differ dispatch here.

use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::ModelShape;

use super::work::model_flops;

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
}
