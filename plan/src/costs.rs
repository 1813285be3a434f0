//! A configuration's cost model: the simulator's per-stage [`CostModel`] in seconds, built
//! from the work of its layers ([`super::work`]) and its communication ([`super::comm`]).
//!
//! Per stage and microbatch, on one TP rank:
//! - F: its layers' forward work, plus 2 TP all-reduces per layer of the `b s h` activation
//!   (with sequence parallelism a reduce-scatter and an all-gather each, the same ring
//!   volume); the first stage adds the vocabulary-parallel embedding's all-reduce, the last
//!   the LM head.
//! - I: the input-gradient work, plus 2 TP all-reduces per layer; W: the weight gradients.
//!   Megatron does not overlap TP communication with compute, so it is added.
//! - R: selective recomputation reruns what the memory model's selective policy drops (the
//!   attention core under materialized attention, the norms and the MLP's activation under
//!   fused: [`super::work`]); full reruns the whole forward (its TP all-reduces included).
//! - The hand-off to the next stage: `b s h` activations split over the TP ranks (Megatron's
//!   scatter/gather: each TP rank sends its `1/tp` over its own link, and the receiving group
//!   all-gathers over NVLink), on the inter-node link where the two devices are on different
//!   nodes, else on the intra-node one.
//! - DP: the stage's gradients (f32, 4 bytes per parameter of the TP shard) all-reduced over
//!   the DP group, started after the stage's last backward as the runtime does; ZeRO-1
//!   reduce-scatters them instead and all-gathers the updated parameters after the step.
//! - Optimizer: AdamW is memory-bound: 30 bytes moved per parameter in bf16 (f32 master
//!   weight read and written, f32 gradient read, two f32 moments read and written, the bf16
//!   copy written), 28 in f32, over HBM bandwidth; ZeRO-1 steps `1/dp` of them.

use super::bound::device_of;
use super::comm::{all_reduce, crosses_nodes, Links};
pub use super::config::layers_per_stage;
use super::config::{Config, PlanRequest};
use super::model::PlanModel;
use super::moe_comm::{layer_all_to_all, ExpertFold, Wire};
use super::pieces::data_parallel;
pub use super::pieces::device;
pub use super::pieces::Pieces;
use super::work::{head, layer, WorkTimes};
use super::work_moe::layer_at;
use pipewright_model::memory::moe::ExpertLayout;
use pipewright_model::memory::{stage_parameters, ModelShape};
use pipewright_schedule::recompute::Recompute;
use pipewright_sim::simulate::{CostModel, RawCostFile, StageCost};

/// The pieces of `cfg` for a GPT of `shape`.
pub fn pieces(req: &PlanRequest, shape: &ModelShape, cfg: &Config) -> Pieces {
    let dev = device(req);
    let links = Links::new(&req.cluster, cfg.tp, cfg.pp, cfg.dp);
    let act = activation_bytes(req, shape, cfg);
    let tp_ar = all_reduce(&links.tp, cfg.tp, act);
    let layers = layers_per_stage(shape.layers, cfg.stages());
    let experts = ExpertLayout {
        ep: cfg.ep,
        etp: cfg.etp,
        capacity: req.capacity_factor,
    };
    let layer_work = (!shape.is_uniform()).then(|| {
        // A layer's work depends only on whether it is an MoE layer: two kinds, timed once.
        let of = |i: u32| {
            let run = (
                cfg.tp,
                cfg.microbatch_size,
                cfg.sequence_parallel,
                req.attention,
            );
            layer_at(shape, i, run, &experts, &dev)
        };
        let first_moe = (0..shape.layers).find(|&i| shape.is_moe_layer(i));
        let first_dense = (0..shape.layers).find(|&i| !shape.is_moe_layer(i));
        let (moe, dense) = (first_moe.map(of), first_dense.map(of));
        (0..shape.layers)
            .map(|i| match shape.is_moe_layer(i) {
                true => moe.unwrap_or_default(),
                false => dense.unwrap_or_default(),
            })
            .collect()
    });
    let all_to_all = all_to_all(req, shape, cfg, &layers);
    Pieces {
        layer: layer(
            shape,
            cfg.tp,
            cfg.microbatch_size,
            cfg.sequence_parallel,
            req.attention,
            &dev,
        ),
        layer_tp: f64::from(ModelShape::TP_COLLECTIVES_PER_BLOCK) * tp_ar,
        head: head(shape, cfg.tp, cfg.microbatch_size, &dev),
        embed_tp: tp_ar,
        layers,
        layer_work,
        all_to_all,
    }
}

/// Each stage's expert all-to-all per microbatch (empty for a dense model).
fn all_to_all(
    req: &PlanRequest,
    shape: &ModelShape,
    cfg: &Config,
    layers: &[u32],
) -> Vec<(f64, f64)> {
    if shape.moe.is_none() {
        return Vec::new();
    }
    let fold = ExpertFold {
        tp: cfg.tp,
        pp: cfg.pp,
        dp: cfg.dp,
        etp: cfg.etp,
        ep: cfg.ep,
    };
    let wire = Wire {
        act_bytes: req.precision.activation_bytes(),
        capacity: req.capacity_factor,
        dispatcher: req.dispatcher,
        fp8_dispatch: req.fp8,
    };
    // One MoE layer's all-to-all is the same in every stage (the fold looks at every
    // stage's placement): found once, times each stage's MoE layers.
    let Some(one) = layer_all_to_all(shape, &req.cluster, &fold, cfg.microbatch_size, wire) else {
        return Vec::new();
    };
    let mut start = 0;
    layers
        .iter()
        .map(|&n| {
            let moe = (start..start + n)
                .filter(|&i| shape.is_moe_layer(i))
                .count() as f64;
            start += n;
            (moe * one.forward_s(), moe * one.backward_s())
        })
        .collect()
}

/// Bytes of one microbatch's `b s h` activation: a TP collective's, and a pipeline
/// hand-off's before its TP split.
fn activation_bytes(req: &PlanRequest, shape: &ModelShape, cfg: &Config) -> f64 {
    shape.tp_collective_elements(cfg.microbatch_size) * req.precision.activation_bytes() as f64
}

/// Recomputation time of stage `s`, given its forward `f`.
/// The all-to-all a recompute of stage `s` reruns: none for selective (it reruns the
/// attention core, norms and activations, no dispatch), the forward's for full, and for
/// `every:k` that of the MoE layers among the stage's first `k` (`None`: the forward's).
fn recompute_comm(
    policy: Recompute,
    shape: &ModelShape,
    p: &Pieces,
    s: u32,
    f_comm: f64,
) -> Option<f64> {
    let n = p.layers[s as usize];
    let first: u32 = p.layers[..s as usize].iter().sum();
    // MoE layers among the stage's first `k`, counted in closed form (`cost_model` runs for
    // every candidate of a plan).
    let moe_among = |k: u32| {
        shape
            .moe
            .map_or(0, |m| m.moe_layers(first + k) - m.moe_layers(first))
    };
    match policy {
        Recompute::None | Recompute::Full => None,
        Recompute::Selective => Some(0.0),
        Recompute::Every(k) => {
            let all = moe_among(n);
            Some(if all == 0 {
                0.0
            } else {
                f_comm * f64::from(moe_among(k.min(n))) / f64::from(all)
            })
        }
    }
}

fn recompute_time(policy: Recompute, p: &Pieces, s: u32, f: f64) -> Option<f64> {
    let n = p.layers[s as usize];
    match policy {
        Recompute::None => None,
        Recompute::Selective => Some(p.stage_layers_work(s, n).0.selective),
        Recompute::Full => Some(f),
        Recompute::Every(k) if p.layer_work.is_none() => {
            Some(f64::from(k.min(n)) * (p.layer.f + p.layer_tp))
        }
        Recompute::Every(k) => {
            let first = p.stage_layers_work(s, k).1;
            Some(first.f + f64::from(k.min(n)) * p.layer_tp)
        }
    }
}

/// `cfg`'s cost model as a cost file (seconds), for `simulate`, `search` and `viz` to take
/// as they take measured costs: the same stages, all-to-all and hand-offs the plan timed.
pub fn costs_file(req: &PlanRequest, cfg: &Config) -> RawCostFile {
    let (model, _) = cost_model(req, cfg);
    RawCostFile::from_model(&model, "s", format!("pipewright plan, predicted: {cfg}"))
}

/// The simulator's cost model of `cfg`, in seconds, with its pieces (a profile's:
/// [`super::layers::cost_model`]).
pub fn cost_model(req: &PlanRequest, cfg: &Config) -> (CostModel, Pieces) {
    match &req.model {
        PlanModel::Gpt(shape) => gpt_cost_model(req, shape, cfg),
        PlanModel::Layers(profile) => super::layers::cost_model(req, profile, cfg),
    }
}

fn gpt_cost_model(req: &PlanRequest, shape: &ModelShape, cfg: &Config) -> (CostModel, Pieces) {
    let p = pieces(req, shape, cfg);
    let stages = cfg.stages();
    let device_of = |s: u32| device_of(cfg, s);
    let links = Links::new(&req.cluster, cfg.tp, cfg.pp, cfg.dp);
    let hand_off = activation_bytes(req, shape, cfg) / f64::from(cfg.tp);
    let costs = (0..stages)
        .map(|s| {
            let n = f64::from(p.layers[s as usize]);
            let last = s + 1 == stages;
            let first = s == 0;
            let extra = |w: WorkTimes| if last { w } else { WorkTimes::default() };
            let work = p.stage_layers_work(s, 0).0 + extra(p.head);
            let (f_comm, b_comm) = p.all_to_all.get(s as usize).copied().unwrap_or_default();
            let embed = if first { p.embed_tp } else { 0.0 };
            let f = work.f + n * p.layer_tp + embed;
            let i = work.i + n * p.layer_tp + if last { p.embed_tp } else { 0.0 };
            let w = work.w;
            let link = if !last
                && crosses_nodes(&req.cluster, cfg.tp, cfg.dp, device_of(s), device_of(s + 1))
            {
                req.cluster.inter_node
            } else {
                req.cluster.intra_node
            };
            let params = stage_parameters(shape, cfg.stages(), s) as f64 / f64::from(cfg.tp);
            let (dp_allreduce, optimizer) = data_parallel(req, cfg, &links, params, req.precision);
            StageCost {
                f,
                b: i + w,
                i,
                w,
                activation_bytes: 0,
                w_memory: 1.0,
                p2p_bytes: hand_off as u64,
                p2p_time: Some(if last { 0.0 } else { link.p2p(hand_off) }),
                overlap: None,
                optimizer,
                dp_allreduce,
                r: recompute_time(cfg.recompute_of(s), &p, s, f),
                r_comm: recompute_comm(cfg.recompute_of(s), shape, &p, s, f_comm),
                kept_bytes: Some(0),
                f_comm,
                b_comm,
            }
        })
        .collect();
    let model = CostModel {
        stages: costs,
        p2p_latency: 0.0,
        bandwidth: None,
        host: None,
    };
    (model, p)
}
