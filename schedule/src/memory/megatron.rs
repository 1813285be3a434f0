//! Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
//! (MLSys 2023), section 4: activation bytes of one transformer layer for one microbatch on
//! one tensor-parallel rank, with 2-byte activations and 1-byte dropout masks. Section 4.3
//! adds the input and output layers: the embedding's dropout mask (`sbh`, `/t` with sequence
//! parallelism) on the first stage; the final LayerNorm's and the output projection's inputs
//! (`4sbh`, `/t` with sequence parallelism) and the logits in f32 for the cross entropy
//! (`4sbV/t`, the output layer being vocabulary-parallel) on the last. Megatron recomputes
//! transformer layers only, so these extras are kept under every policy.

use super::walk::StageBytes;
use super::{params, MemoryConfig};
use crate::recompute::Recompute;

/// `(s*b*h, t, the 5as/h term's bytes 5*a*s*s*b / t)` of a configuration, as integers.
fn dims(cfg: &MemoryConfig) -> (u128, u128, u128) {
    let sh = &cfg.shape;
    let sbh = u128::from(sh.seq_len) * u128::from(cfg.microbatch_size) * u128::from(sh.d_model);
    let t = u128::from(cfg.tp.max(1));
    let s = u128::from(sh.seq_len);
    let core = 5 * u128::from(sh.heads) * s * s * u128::from(cfg.microbatch_size) / t;
    (sbh, t, core)
}

/// Bytes of one pipeline hand-off on one rank: `2sbh`, `/t` with sequence parallelism.
pub(super) fn handoff_bytes(cfg: &MemoryConfig) -> u64 {
    let (sbh, t, _) = dims(cfg);
    let split = if cfg.sequence_parallel { t } else { 1 };
    u64::try_from(2 * sbh / split).unwrap_or(u64::MAX)
}

/// One layer's bytes under `policy` (for `Every`, a layer that is recomputed: its input).
pub(super) fn layer_bytes(cfg: &MemoryConfig, policy: Recompute) -> u64 {
    let (sbh, t, core) = dims(cfg);
    let sp = cfg.sequence_parallel;
    let bytes = match policy {
        // (sbh/t)(34 + 5as/h) with SP; sbh(10 + 24/t + 5as/(ht)) without (sbh(34 + 5as/h)
        // at t = 1).
        Recompute::None if sp => 34 * sbh / t + core,
        Recompute::None => 10 * sbh + 24 * sbh / t + core,
        Recompute::Selective if sp => 34 * sbh / t,
        Recompute::Selective => 10 * sbh + 24 * sbh / t,
        Recompute::Full | Recompute::Every(_) if sp => 2 * sbh / t,
        Recompute::Full | Recompute::Every(_) => 2 * sbh,
    };
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// The input and output layers' bytes of stage `s` (see the module's note).
fn extras(cfg: &MemoryConfig, s: u32) -> u128 {
    let (sbh, t, _) = dims(cfg);
    let split = if cfg.sequence_parallel { t } else { 1 };
    let sbv = u128::from(cfg.shape.seq_len)
        * u128::from(cfg.microbatch_size)
        * u128::from(cfg.shape.vocab);
    let first = if s == 0 { sbh / split } else { 0 };
    let last = if s + 1 == cfg.stages() {
        4 * sbh / split + 4 * sbv / t
    } else {
        0
    };
    first + last
}

/// Stage `s`'s bytes per microbatch. Megatron recomputes inside each layer's backward, one
/// layer at a time, so a recomputing stage grows by one layer's dropped bytes before its
/// backward (an `R` is counted the same way). W holds the zero-bubble paper's
/// `M_W = 32sbh` per layer (Qi et al. 2023, section 2.3), split over t, and the extras.
pub(super) fn stage_bytes(cfg: &MemoryConfig, s: u32) -> StageBytes {
    let layers = u128::from(params::stage_layers(cfg.shape.layers, cfg.stages(), s));
    let (sbh, t, _) = dims(cfg);
    let layer = |p| u128::from(layer_bytes(cfg, p));
    let extra = extras(cfg, s);
    let whole = layer(Recompute::None);
    let (kept, one_layer) = match cfg.recompute.of(s) {
        Recompute::Every(n) => {
            let k = layers.min(u128::from(n));
            let kept = k * layer(Recompute::Full) + (layers - k) * whole + extra;
            let grows = if k > 0 {
                whole - layer(Recompute::Full)
            } else {
                0
            };
            (kept, grows)
        }
        policy => (layers * layer(policy) + extra, whole - layer(policy)),
    };
    let weight = layers * 32 * sbh / t + extra;
    StageBytes {
        kept: kept as f64,
        full: (kept + one_layer) as f64,
        weight: weight as f64,
        whole: (layers * whole + extra) as f64,
    }
}
