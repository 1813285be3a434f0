//! The profiling pass: each layer's forward, input backward and weight backward timed on a
//! sample microbatch, with the bytes it keeps and hands on, and the parameters it holds;
//! as split's weights ([`profile`]) or as a layer profile for `pipewright plan --profile`
//! ([`layer_profile`]).

use std::time::Instant;

use pipewright_kernels::layers::NoTp;
use pipewright_kernels::{params, Footprint, Tensor};
use pipewright_model::layer_profile::{LayerProfile, ProfiledLayer};

use super::{BoxedLayer, DynLayer, LayerCost, SplitError};
use crate::module::ModuleError;

/// One layer measured on one microbatch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerMeasure {
    /// Median times, ms.
    pub cost: LayerCost,
    /// Parameters (elements).
    pub params: u64,
    /// Bytes of the parameters' values.
    pub param_bytes: u64,
    /// Bytes of the forward's stash (its [`Footprint`]).
    pub stash_bytes: u64,
    /// Bytes of the input backward's weight stash.
    pub weight_stash_bytes: u64,
    /// Bytes of the output.
    pub output_bytes: u64,
}

/// Time every layer's forward, input backward and weight backward on `sample` (the first
/// layer's input; each layer gets the previous one's output), `repeats` times (at least
/// once), keeping the medians; the gradients this accumulates are zeroed.
pub fn profile(
    layers: &mut [BoxedLayer],
    sample: &Tensor,
    repeats: usize,
) -> Result<Vec<LayerCost>, SplitError> {
    Ok(measure(layers, sample, repeats)?
        .iter()
        .map(|m| m.cost)
        .collect())
}

/// [`profile`], with each layer's parameters, stash bytes after its forward, weight-stash
/// bytes after its input backward and output bytes, for a microbatch of `sample`'s size.
pub fn measure(
    layers: &mut [BoxedLayer],
    sample: &Tensor,
    repeats: usize,
) -> Result<Vec<LayerMeasure>, SplitError> {
    let mut x = sample.clone();
    let mut out = Vec::with_capacity(layers.len());
    for (k, layer) in layers.iter_mut().enumerate() {
        let (m, y) = measure_one(k, &mut **layer, &x, repeats)?;
        out.push(m);
        x = y;
    }
    Ok(out)
}

/// Layer `k` measured on its input `x`, `repeats` times (at least once), keeping the
/// medians and leaving its gradients zero; with its output, the next layer's input.
pub(crate) fn measure_one(
    k: usize,
    layer: &mut dyn DynLayer,
    x: &Tensor,
    repeats: usize,
) -> Result<(LayerMeasure, Tensor), SplitError> {
    let bad = |e: ModuleError| SplitError::Profile {
        layer: k,
        message: e.to_string(),
    };
    let mut runs = Vec::new();
    let mut last = None;
    for _ in 0..repeats.max(1) {
        let t0 = Instant::now();
        let (y, stash) = layer.forward_dyn(x, &mut NoTp).map_err(bad)?;
        let t1 = Instant::now();
        let stash_bytes = stash.bytes();
        let dy = Tensor::new(y.shape(), vec![1.0; y.numel()]).map_err(|e| bad(e.into()))?;
        let t2 = Instant::now();
        let (_, ws) = layer
            .backward_input_dyn(stash, &dy, &mut NoTp)
            .map_err(bad)?;
        let t3 = Instant::now();
        let weight_stash_bytes = ws.bytes();
        let t4 = Instant::now();
        layer.backward_weight_dyn(ws).map_err(bad)?;
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        runs.push(LayerCost {
            f: ms(t0, t1),
            i: ms(t2, t3),
            w: ms(t4, Instant::now()),
        });
        let sizes = LayerMeasure {
            cost: LayerCost::default(),
            params: layer.num_params() as u64,
            param_bytes: params::storage_bytes(layer).0 as u64,
            stash_bytes: stash_bytes as u64,
            weight_stash_bytes: weight_stash_bytes as u64,
            output_bytes: y.bytes() as u64,
        };
        last = Some((sizes, y));
    }
    layer.zero_grad();
    let (sizes, y) = last.ok_or_else(|| bad("no pass ran".into()))?;
    let cost = median(&runs);
    Ok((LayerMeasure { cost, ..sizes }, y))
}

fn median(runs: &[LayerCost]) -> LayerCost {
    let mid = |pick: fn(&LayerCost) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    LayerCost {
        f: mid(|c| c.f),
        i: mid(|c| c.i),
        w: mid(|c| c.w),
    }
}

/// A layer profile of `layers` for `pipewright plan --profile`: [`measure`] on `sample`, a
/// microbatch of `samples` samples, on `device` (free text: where it was measured). Write it
/// with [`LayerProfile::write`]. For a list that runs with `tp > 1`, [`layer_profile_tp`].
pub fn layer_profile(
    layers: &mut [BoxedLayer],
    sample: &Tensor,
    samples: u64,
    repeats: usize,
    device: &str,
) -> Result<LayerProfile, SplitError> {
    layer_profile_tp(layers, sample, samples, repeats, device, 1)
}

/// [`layer_profile`] of one TP rank's layers of a `tp`-way layer list (built from
/// `TpShard::new(0, tp)`): the bytes it records are that rank's (a sharded layer's
/// parameters and stashes are its shard's, a replicated one's whole), which is what the
/// memory model and `plan --profile` then count per rank, and the profile says `tp`, the
/// one degree `plan --profile` plans for it. Its times are the rank's compute alone (the
/// layers run without their TP all-reduces here). A `tp` outside 1 to
/// [`MAX_TP`](pipewright_model::layer_profile::MAX_TP) is refused, as the profile's reader would.
pub fn layer_profile_tp(
    layers: &mut [BoxedLayer],
    sample: &Tensor,
    samples: u64,
    repeats: usize,
    device: &str,
    tp: u32,
) -> Result<LayerProfile, SplitError> {
    if !(1..=pipewright_model::layer_profile::MAX_TP).contains(&tp) {
        return Err(SplitError::Tp(tp));
    }
    let measured = measure(layers, sample, repeats)?;
    Ok(LayerProfile {
        microbatch_size: samples.max(1),
        device: device.to_string(),
        tp,
        layers: measured
            .iter()
            .map(|m| ProfiledLayer {
                f_ms: m.cost.f,
                i_ms: m.cost.i,
                w_ms: m.cost.w,
                params: m.params,
                param_bytes: m.param_bytes,
                stash_bytes: m.stash_bytes,
                weight_stash_bytes: m.weight_stash_bytes,
                output_bytes: m.output_bytes,
                flops: None,
            })
            .collect(),
    })
}
