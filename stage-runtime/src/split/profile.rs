//! The profiling pass: each layer's forward, input backward and weight backward timed on a
//! sample microbatch, with the bytes it keeps and hands on, and the parameters it holds;
//! as split's weights ([`profile`]) or as a layer profile for `pipewright plan --profile`
//! ([`layer_profile`]).

use std::time::Instant;

use pipewright_kernels::{params, Footprint, Tensor};
use pipewright_schedule::layer_profile::{LayerProfile, ProfiledLayer};

use super::{Layer, LayerCost, SplitError};
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
    /// Bytes of the forward's stash ([`Layer::stash_bytes`]).
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
    layers: &mut [Box<dyn Layer>],
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
    layers: &mut [Box<dyn Layer>],
    sample: &Tensor,
    repeats: usize,
) -> Result<Vec<LayerMeasure>, SplitError> {
    let mut runs = vec![Vec::new(); layers.len()];
    let mut sizes = vec![LayerMeasure::default(); layers.len()];
    for _ in 0..repeats.max(1) {
        let mut x = sample.clone();
        for (k, layer) in layers.iter_mut().enumerate() {
            let bad = |e: ModuleError| SplitError::Profile {
                layer: k,
                message: e.to_string(),
            };
            let t0 = Instant::now();
            let (y, stash) = layer.forward(&x).map_err(bad)?;
            let t1 = Instant::now();
            let stash_bytes = layer.stash_bytes(&stash);
            let dy = Tensor::new(y.shape(), vec![1.0; y.numel()]).map_err(|e| bad(e.into()))?;
            let t2 = Instant::now();
            let (_, ws) = layer.backward_input(stash, &dy).map_err(bad)?;
            let t3 = Instant::now();
            let weight_stash_bytes = layer.stash_bytes(&ws);
            let t4 = Instant::now();
            layer.backward_weight(ws).map_err(bad)?;
            let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
            runs[k].push(LayerCost {
                f: ms(t0, t1),
                i: ms(t2, t3),
                w: ms(t4, Instant::now()),
            });
            sizes[k] = LayerMeasure {
                cost: LayerCost::default(),
                params: layer.num_params() as u64,
                param_bytes: params::storage_bytes(&**layer).0 as u64,
                stash_bytes: stash_bytes as u64,
                weight_stash_bytes: weight_stash_bytes as u64,
                output_bytes: y.bytes() as u64,
            };
            x = y;
        }
    }
    layers.iter_mut().for_each(|l| l.zero_grad());
    Ok(runs
        .iter()
        .zip(sizes)
        .map(|(r, m)| LayerMeasure {
            cost: median(r),
            ..m
        })
        .collect())
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
/// with `serde_json` of [`LayerProfile::to_raw`].
pub fn layer_profile(
    layers: &mut [Box<dyn Layer>],
    sample: &Tensor,
    samples: u64,
    repeats: usize,
    device: &str,
) -> Result<LayerProfile, SplitError> {
    let measured = measure(layers, sample, repeats)?;
    Ok(LayerProfile {
        microbatch_size: samples.max(1),
        device: device.to_string(),
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
