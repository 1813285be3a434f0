//! A layer-list profile's side of the plan: its stages' costs and memory from what the
//! profile measured, with no FLOPs model and no efficiency curve.
//!
//! - Cuts: `pp * v` contiguous stages balancing forward + backward time (the profile's
//!   [`LayerProfile::cuts`], the runtime's `Balance::Time` cut), the same cuts the launch
//!   line gives.
//! - Times: a stage's F, I and W are its layers' profiled times, scaled linearly from the
//!   profile's microbatch size to the configuration's; full recomputation reruns its F. The
//!   times are those of the device the profile was measured on: the cluster file gives
//!   memory, GPUs per node, links and HBM bandwidth, not the speed of the layers.
//! - Hand-offs: the stage's last layer's output bytes (scaled), over the inter-node link
//!   where the two devices sit on different nodes.
//! - DP and optimizer: the stage's parameters, as for the GPT (f32 gradients reduced over
//!   the DP group, a memory-bound AdamW), with the weights in the profile's own format
//!   (its `param_bytes` per parameter: f32 for the runtime's host layers), not `--precision`'s:
//!   ZeRO-1 all-gathers those bytes.
//! - TP: the profile's own degree (`LayerProfile::tp`), whose bytes and times are one TP
//!   rank's as measured; the TP all-reduces inside its layers are not timed.
//! - Memory: [`pipewright_model::memory::predict_layers`], the runtime's `LayerStage` to the byte.

use std::ops::Range;

use super::bound::device_of;
use super::cluster::Precision;
use super::comm::{crosses_nodes, Links};
use super::config::{Config, PlanRequest};
use super::pieces::{data_parallel, Pieces};
use super::work::WorkTimes;
use super::PlanError;
use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::{predict_layers, LayerMemoryConfig, MemoryBreakdown};
use pipewright_schedule::timetable::Timetable;
use pipewright_sim::simulate::{CostModel, StageCost};

/// The layers of each of `cfg`'s stages (empty when it has more stages than layers, which
/// the search never asks).
pub fn cuts(profile: &LayerProfile, cfg: &Config) -> Vec<Range<usize>> {
    profile.cuts(cfg.stages() as usize).unwrap_or_default()
}

/// Per stage, its forward, input-backward and weight-backward milliseconds at the profile's
/// microbatch size: the sums of its layers'.
pub fn stage_ms(profile: &LayerProfile, cuts: &[Range<usize>]) -> Vec<(f64, f64, f64)> {
    cuts.iter()
        .map(|r| {
            let l = &profile.layers[r.clone()];
            let sum = |pick: fn(&pipewright_model::layer_profile::ProfiledLayer) -> f64| {
                l.iter().map(pick).sum::<f64>()
            };
            (sum(|l| l.f_ms), sum(|l| l.i_ms), sum(|l| l.w_ms))
        })
        .collect()
}

/// The format the profile's weights are kept in, from its bytes per parameter: f32 at 4 or
/// more, bf16 below.
fn weight_precision(profile: &LayerProfile) -> Precision {
    let params: u64 = profile.layers.iter().map(|l| l.params).sum();
    let bytes: u64 = profile.layers.iter().map(|l| l.param_bytes).sum();
    if params == 0 || bytes >= 4 * params {
        Precision::F32
    } else {
        Precision::Bf16
    }
}

/// How much larger `cfg`'s microbatch is than the profile's.
fn scale(profile: &LayerProfile, cfg: &Config) -> f64 {
    cfg.microbatch_size as f64 / profile.microbatch_size as f64
}

/// The simulator's cost model of `cfg` for `profile`, in seconds, with its pieces (no TP
/// communication: the profile's times are one TP rank's compute).
pub fn cost_model(req: &PlanRequest, profile: &LayerProfile, cfg: &Config) -> (CostModel, Pieces) {
    let cuts = cuts(profile, cfg);
    let k = scale(profile, cfg) / 1e3;
    let links = Links::new(&req.cluster, cfg.tp, cfg.pp, cfg.dp);
    let stages = cuts.len() as u32;
    let weights = weight_precision(profile);
    let costs = stage_ms(profile, &cuts)
        .into_iter()
        .enumerate()
        .map(|(s, (f, i, w))| {
            let (s32, last) = (s as u32, s as u32 + 1 == stages);
            let (f, i, w) = (f * k, i * k, w * k);
            let out = profile.layers[cuts[s].end - 1].output_bytes as f64 * k * 1e3;
            let cross = !last
                && crosses_nodes(
                    &req.cluster,
                    cfg.tp,
                    cfg.dp,
                    device_of(cfg, s32),
                    device_of(cfg, s32 + 1),
                );
            let link = if cross {
                req.cluster.inter_node
            } else {
                req.cluster.intra_node
            };
            let params: u64 = profile.layers[cuts[s].clone()]
                .iter()
                .map(|l| l.params)
                .sum();
            let (dp_allreduce, optimizer) = data_parallel(req, cfg, &links, params as f64, weights);
            StageCost {
                f,
                b: i + w,
                i,
                w,
                activation_bytes: 0,
                w_memory: 1.0,
                p2p_bytes: out as u64,
                p2p_time: Some(if last { 0.0 } else { link.p2p(out) }),
                overlap: None,
                optimizer,
                dp_allreduce,
                r: (cfg.recompute_of(s32) != pipewright_schedule::recompute::Recompute::None)
                    .then_some(f),
                kept_bytes: Some(0),
                ..Default::default()
            }
        })
        .collect();
    let pieces = Pieces {
        layer: WorkTimes::default(),
        layer_tp: 0.0,
        head: WorkTimes::default(),
        embed_tp: 0.0,
        layers: cuts.iter().map(|r| r.len() as u32).collect(),
        layer_work: None,
        all_to_all: Vec::new(),
    };
    let model = CostModel {
        stages: costs,
        p2p_latency: 0.0,
        bandwidth: None,
        host: None,
    };
    (model, pieces)
}

/// Each pipeline device's predicted peak for `cfg`'s timetable `tt`.
pub fn peaks(
    profile: &LayerProfile,
    cfg: &Config,
    tt: &Timetable,
) -> Result<Vec<MemoryBreakdown>, PlanError> {
    let mem = LayerMemoryConfig {
        profile,
        cuts: cuts(profile, cfg),
        dp: cfg.dp,
        microbatch_size: cfg.microbatch_size,
        zero: cfg.zero,
        recompute: cfg.recompute_plan(),
    };
    Ok(predict_layers(&mem, tt)?
        .into_iter()
        .map(|d| d.peak)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::a100_80g;
    use pipewright_model::layer_profile::{RawLayer, RawLayerProfile};
    use pipewright_schedule::recompute::Recompute;
    use pipewright_schedule::spec::ScheduleKind;

    fn profile() -> LayerProfile {
        let layer = |k: u64| RawLayer {
            f_ms: Some(1.0 + k as f64),
            i_ms: Some(1.5 + k as f64),
            w_ms: Some(0.5 * k as f64),
            params: Some(1000 * (k + 1)),
            param_bytes: Some(4000 * (k + 1)),
            stash_bytes: Some(64),
            weight_stash_bytes: Some(32),
            output_bytes: Some(1 << 20),
            flops: None,
        };
        LayerProfile::from_raw(RawLayerProfile {
            version: Some(1),
            microbatch_size: Some(4),
            device: Some("test".into()),
            tp: None,
            layers: Some((0..6).map(layer).collect()),
        })
        .unwrap()
    }

    fn config(mbs: u64, recompute: Recompute) -> Config {
        Config {
            tp: 1,
            pp: 2,
            dp: 1,
            v: 1,
            microbatch_size: mbs,
            microbatches: 8,
            schedule: ScheduleKind::OneFOneB,
            recompute,
            recompute_devices: 2,
            zero: 0,
            sequence_parallel: false,
            ep: 1,
            etp: 1,
        }
    }

    #[test]
    fn stage_costs_are_the_profile_s_sums_over_the_cuts() {
        let p = profile();
        let req = PlanRequest::from_profile(p.clone(), a100_80g(), 2, 32);
        for (mbs, recompute) in [(4, Recompute::None), (8, Recompute::Full)] {
            let cfg = config(mbs, recompute);
            let cuts = cuts(&p, &cfg);
            assert_eq!(cuts, p.cuts(2).unwrap());
            let (model, pieces) = cost_model(&req, &p, &cfg);
            assert_eq!(
                pieces.layers,
                vec![cuts[0].len() as u32, cuts[1].len() as u32]
            );
            let k = mbs as f64 / 4.0;
            for (s, r) in cuts.iter().enumerate() {
                let layers = &p.layers[r.clone()];
                let f: f64 = layers.iter().map(|l| l.f_ms).sum::<f64>() * k / 1e3;
                let i: f64 = layers.iter().map(|l| l.i_ms).sum::<f64>() * k / 1e3;
                let w: f64 = layers.iter().map(|l| l.w_ms).sum::<f64>() * k / 1e3;
                let c = &model.stages[s];
                assert!((c.f - f).abs() < 1e-15 && (c.i - i).abs() < 1e-15, "{s}");
                assert!(
                    (c.w - w).abs() < 1e-15 && (c.b - i - w).abs() < 1e-15,
                    "{s}"
                );
                let want_r = (recompute == Recompute::Full).then_some(c.f);
                assert_eq!(c.r, want_r);
            }
            // The hand-off is the first stage's last output, over NVLink inside a node.
            let out = (1u64 << 20) as f64 * k;
            assert_eq!(model.stages[0].p2p_bytes, out as u64);
            assert_eq!(
                model.stages[0].p2p_time,
                Some(req.cluster.intra_node.p2p(out))
            );
            assert_eq!(model.stages[1].p2p_time, Some(0.0));
        }
    }

    /// A profile measured on one rank of tp 2 (its bytes that rank's shard) is planned at tp
    /// 2 alone, without sequence parallelism (its layers have none); one of tp 1 at tp 1.
    #[test]
    fn a_profile_is_planned_at_the_tp_it_was_measured_at() {
        let tps = |tp: u32| {
            let p = LayerProfile { tp, ..profile() };
            let req = PlanRequest::from_profile(p, a100_80g(), 8, 64);
            let all = crate::space::enumerate(&req);
            assert!(!all.is_empty());
            assert!(all.iter().all(|c| !c.sequence_parallel));
            let mut seen: Vec<u32> = all.iter().map(|c| c.tp).collect();
            seen.dedup();
            seen
        };
        assert_eq!(tps(2), vec![2]);
        assert_eq!(tps(1), vec![1]);
    }

    /// A profile's weights are its own (f32 here: 4 bytes a parameter), whatever `--precision`
    /// says: ZeRO-1's all-gather moves 4 bytes a parameter and AdamW the f32 run's bytes, so
    /// the DP and optimizer terms are those of an f32 request under bf16 too.
    #[test]
    fn dp_and_optimizer_terms_follow_the_profile_s_weights_not_precision() {
        let p = profile();
        let cfg = Config {
            dp: 4,
            zero: 1,
            ..config(4, Recompute::None)
        };
        let mut f32_req = PlanRequest::from_profile(p.clone(), a100_80g(), 8, 128);
        f32_req.precision = Precision::F32;
        let mut bf16_req = f32_req.clone();
        bf16_req.precision = Precision::Bf16;
        let (a, _) = cost_model(&f32_req, &p, &cfg);
        let (b, _) = cost_model(&bf16_req, &p, &cfg);
        for (x, y) in a.stages.iter().zip(&b.stages) {
            assert_eq!(x.optimizer, y.optimizer);
            assert_eq!(x.dp_allreduce, y.dp_allreduce);
            assert!(x.optimizer > 0.0 && x.dp_allreduce > 0.0);
        }
    }
}
