//! The memory of a layer-list model (a [`LayerProfile`]) on a pipeline, as pipewright's
//! runtime holds a `LayerStage`'s: the profile's measured bytes summed over each stage's
//! layers, walked over the timetable by the same walk as the GPT's ([`super::timeline`]).
//!
//! Per stage and microbatch (the profile's bytes scaled by `microbatch_size` over the
//! profile's, linearly):
//! - its forward stash is its layers' stashes, plus on the last stage the loss gradient
//!   (the size of the model's output); under full recomputation it keeps only its input
//!   (nothing on the first stage, whose input the data rebuilds) and reruns the forward;
//! - its weight stash (I to W) is its layers' weight stashes;
//! - its hand-off is its last layer's output (and the gradient of it coming back).
//!
//! Per rank: the parameters' bytes as profiled, gradients the same, AdamW's two f32 moments
//! (8 bytes per parameter; `8 ceil(n/dp)` per stage under ZeRO-1, the first rank's shard),
//! and under data parallelism each stage's flat f32 gradients while they are reduced.

use std::ops::Range;

use super::walk::StageBytes;
use super::{timeline, walk_devices, DevicePrediction, MemoryBreakdown, MemoryError};
use crate::layer_profile::LayerProfile;
use pipewright_schedule::recompute::{recomputed, Recompute, RecomputePlan};
use pipewright_schedule::timetable::{lower, Timetable};

/// Everything a layer-list model's prediction depends on besides its timetable.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerMemoryConfig<'a> {
    /// The model as measured.
    pub profile: &'a LayerProfile,
    /// The layers of each stage, `pp * v` contiguous ranges.
    pub cuts: Vec<Range<usize>>,
    /// Data-parallel replicas.
    pub dp: u32,
    /// Samples per microbatch.
    pub microbatch_size: u64,
    /// ZeRO level: 0 or 1.
    pub zero: u8,
    /// Per stage: none or full.
    pub recompute: RecomputePlan,
}

impl LayerMemoryConfig<'_> {
    /// The profile's bytes per microbatch of this size.
    fn scale(&self) -> f64 {
        self.microbatch_size as f64 / self.profile.microbatch_size as f64
    }

    fn check(&self, tt: &Timetable) -> Result<(), MemoryError> {
        if self.microbatch_size == 0 {
            return Err(MemoryError::NotPositive("microbatch_size"));
        }
        if self.zero > 1 {
            return Err(MemoryError::Zero(self.zero));
        }
        let n = self.profile.len();
        let covers = self.cuts.first().map(|r| r.start) == Some(0)
            && self.cuts.last().map(|r| r.end) == Some(n)
            && self.cuts.windows(2).all(|w| w[0].end == w[1].start)
            && self.cuts.iter().all(|r| r.start < r.end);
        if !covers || self.cuts.len() != tt.num_stages() as usize {
            return Err(MemoryError::Recompute(format!(
                "the cuts {:?} are not {} contiguous non-empty stages of {n} layers",
                self.cuts,
                tt.num_stages()
            )));
        }
        self.recompute
            .check(tt.num_stages())
            .map_err(|e| MemoryError::Recompute(e.to_string()))?;
        let stages = 0..tt.num_stages();
        match stages.map(|s| self.recompute.of(s)).find(|p| {
            !matches!(p, Recompute::None | Recompute::Full)
        }) {
            Some(p) => Err(MemoryError::Recompute(format!(
                "a layer-list model recomputes fully or not at all (its layers' stashes are opaque), not {p}"
            ))),
            None => Ok(()),
        }
    }

    /// Stage `s`'s output bytes (its last layer's).
    fn output(&self, s: usize) -> f64 {
        let last = self.cuts[s].end - 1;
        self.profile.layers[last].output_bytes as f64 * self.scale()
    }

    fn stage_bytes(&self, s: usize, policy: Recompute) -> StageBytes {
        let layers = &self.profile.layers[self.cuts[s].clone()];
        let last = s + 1 == self.cuts.len();
        let loss_grad = if last { self.output(s) } else { 0.0 };
        let sum = |pick: fn(&crate::layer_profile::ProfiledLayer) -> u64| {
            layers.iter().map(pick).sum::<u64>() as f64 * self.scale()
        };
        let full = sum(|l| l.stash_bytes) + loss_grad;
        let kept = match (policy, s) {
            (Recompute::Full, 0) => 0.0,
            (Recompute::Full, _) => self.output(s - 1),
            _ => full,
        };
        StageBytes {
            kept,
            full,
            weight: sum(|l| l.weight_stash_bytes),
            whole: full,
        }
    }

    /// Parameters (elements) of stage `s`.
    pub fn stage_parameters(&self, s: usize) -> u64 {
        self.profile.layers[self.cuts[s].clone()]
            .iter()
            .map(|l| l.params)
            .sum()
    }

    fn device_state(&self, tt: &Timetable, d: u32) -> MemoryBreakdown {
        let dp = u64::from(self.dp.max(1));
        let mut b = MemoryBreakdown::default();
        for s in (0..tt.num_stages()).filter(|&s| tt.device_of(s) == Some(d)) {
            let layers = &self.profile.layers[self.cuts[s as usize].clone()];
            let bytes: u64 = layers.iter().map(|l| l.param_bytes).sum();
            let n = self.stage_parameters(s as usize);
            b.parameters += bytes;
            b.gradients += bytes;
            b.optimizer_state += 8 * if self.zero >= 1 { n.div_ceil(dp) } else { n };
        }
        b
    }
}

/// Per pipeline device, its largest rank's memory by category (see the module docs), like
/// [`super::predict_detail`] for a GPT. A stage with `R` actions in `tt` and no policy in
/// `cfg` recomputes fully, as in the runtime.
pub fn predict_layers(
    cfg: &LayerMemoryConfig<'_>,
    tt: &Timetable,
) -> Result<Vec<DevicePrediction>, MemoryError> {
    cfg.check(tt)?;
    let mut plan = cfg.recompute.clone();
    for s in recomputed(tt) {
        if plan.of(s) == Recompute::None {
            plan.stages.insert(s, Recompute::Full);
        }
    }
    let low = if tt.is_lowered() {
        tt.clone()
    } else {
        lower(tt).map_err(|e| MemoryError::Lower(e.to_string()))?
    };
    let stages: Vec<StageBytes> = (0..cfg.cuts.len())
        .map(|s| cfg.stage_bytes(s, plan.of(s as u32)))
        .collect();
    let dp = u64::from(cfg.dp.max(1));
    let numel = |s: usize| cfg.stage_parameters(s);
    let reduced = dp > 1;
    let buffers = timeline::BufferBytes {
        handoff: 0.0,
        outputs: Some((0..cfg.cuts.len()).map(|s| cfg.output(s)).collect()),
        grads: (0..cfg.cuts.len())
            .map(|s| if reduced { (4 * numel(s)) as f64 } else { 0.0 })
            .collect(),
        shards: (reduced && cfg.zero >= 1).then(|| {
            (0..cfg.cuts.len())
                .map(|s| (4 * numel(s).div_ceil(dp)) as f64)
                .collect()
        }),
    };
    Ok(walk_devices(&low, &stages, &buffers, |d| {
        cfg.device_state(tt, d)
    }))
}
