//! Each rank's memory, predicted before launch: parameters, gradients and optimizer state
//! from the model's shape, the mesh and the ZeRO level; stashed activations from the shape,
//! the recompute policy and a walk of each device's actions in the timetable.
//!
//! Two accountings of activations:
//! - [`Accounting::Megatron`]: Korthikanti et al. 2022 ("Reducing Activation Recomputation in
//!   Large Transformer Models"), per layer `sbh(34 + 5as/h)` bytes without parallelism,
//!   `sbh(10 + 24/t + 5as/(ht))` with TP, `(sbh/t)(34 + 5as/h)` with TP and sequence
//!   parallelism; selective recomputation removes `5as/h`, full keeps the layer input `2sbh`.
//!   For planning real clusters.
//! - [`Accounting::Pipewright`]: exactly what pipewright's reference GPT stashes (tensors
//!   in f32 storage, or bf16 under [`MemPrecision::Bf16`]; row statistics, ids and
//!   probabilities in 4 bytes), checked against the runtime's measured bytes.
//!
//! ```
//! use pipewright_model::memory::{predict, Accounting, MemoryConfig, ModelShape};
//! use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
//!
//! let shape = ModelShape::gpt(8, 1024, 16, 4096, 256, 8192);
//! let cfg = MemoryConfig::new(shape, 4).with_accounting(Accounting::Pipewright);
//! let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None)?);
//! let per_device = predict(&cfg, &tt)?;
//! // 1F1B: the first device holds 4 microbatches in flight, the last only one.
//! assert!(per_device[0].activations > 3 * per_device[3].activations / 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::{Deserialize, Serialize};

use pipewright_schedule::recompute::{Recompute, RecomputePlan};
use pipewright_schedule::timetable::Timetable;

mod breakdown;
mod layers;
mod megatron;
pub mod moe;
mod params;
mod pipewright;
mod profile;
pub mod request;
mod timeline;
mod walk;

pub use crate::shape::{AttentionKind, ModelShape};
pub use breakdown::MemoryBreakdown;
pub use layers::{predict_layers, LayerMemoryConfig};
pub use params::stage_parameters;
pub use profile::{predict_profiled, Profile};
pub use request::{representable, rough_bytes, MemoryRequest, MemoryRequestError};
pub use walk::{device_levels, peak_walk, StageBytes};

/// Number formats of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemPrecision {
    /// Everything f32 (pipewright's f32 and tf32 runs): 16 bytes per parameter with AdamW
    /// (4 weight, 4 gradient, 8 moments); `8 + 8/d` under ZeRO-1.
    #[default]
    F32,
    /// Megatron-style mixed precision: bf16 weights and activations, f32 gradients, f32
    /// master weights and AdamW moments: 18 bytes per parameter, `6 + 12/d` under ZeRO-1.
    Bf16,
}

impl From<pipewright_kinds::Precision> for MemPrecision {
    /// A run's number format as the memory model stores it: bf16 is mixed precision, tf32
    /// stores f32.
    fn from(p: pipewright_kinds::Precision) -> Self {
        match p {
            pipewright_kinds::Precision::Bf16 => MemPrecision::Bf16,
            pipewright_kinds::Precision::Tf32 | pipewright_kinds::Precision::F32 => {
                MemPrecision::F32
            }
        }
    }
}

/// Whose activations (and parameter layout) the model counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accounting {
    /// Korthikanti et al. 2022's per-layer bytes (2-byte activations, 1-byte dropout masks)
    /// and Megatron's layout (vocabulary-parallel embedding and output layer).
    #[default]
    Megatron,
    /// Exactly what pipewright's reference GPT stashes, in its storage (tensors 4 bytes an
    /// element, 2 in a bf16 run), and its layout (embedding and LM head replicated on every
    /// TP rank).
    Pipewright,
}

impl Accounting {
    /// The names it is written as (the CLI's `--accounting` values).
    pub const NAMES: [&'static str; 2] = ["pipewright", "megatron"];
}

impl std::str::FromStr for Accounting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pipewright" => Ok(Accounting::Pipewright),
            "megatron" => Ok(Accounting::Megatron),
            _ => Err(format!(
                "`{s}` is not an accounting: expected {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// Everything the prediction depends on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// The model.
    pub shape: ModelShape,
    /// Number formats.
    pub precision: MemPrecision,
    /// Whose activations are counted.
    pub accounting: Accounting,
    /// Pipeline devices.
    pub pp: u32,
    /// Tensor-parallel ranks per stage.
    pub tp: u32,
    /// Data-parallel replicas.
    pub dp: u32,
    /// Model chunks per device; the timetable has `pp * v` stages.
    pub v: u32,
    /// Sequences per microbatch (`b`).
    pub microbatch_size: u64,
    /// Sequence parallelism with TP (Korthikanti et al.).
    pub sequence_parallel: bool,
    /// ZeRO level: 0 or 1.
    pub zero: u8,
    /// What each stage keeps from its forward until its backward.
    pub recompute: RecomputePlan,
    /// How the run computes attention: what a layer keeps of it, and what selective
    /// recomputation drops (see [`layer_activation_bytes`]).
    #[serde(default)]
    pub attention: AttentionKind,
    /// How the experts of a mixture are laid out (all 1 for a dense model).
    #[serde(default)]
    pub experts: moe::ExpertLayout,
}

impl MemoryConfig {
    /// `shape` on `pp` pipeline devices, nothing else split: f32, Megatron accounting, one
    /// sequence per microbatch, no recomputation, no ZeRO.
    pub fn new(shape: ModelShape, pp: u32) -> Self {
        MemoryConfig {
            shape,
            precision: MemPrecision::F32,
            accounting: Accounting::Megatron,
            pp,
            tp: 1,
            dp: 1,
            v: 1,
            microbatch_size: 1,
            sequence_parallel: false,
            zero: 0,
            recompute: RecomputePlan::default(),
            attention: AttentionKind::Materialized,
            experts: moe::ExpertLayout::default(),
        }
    }

    /// The same with another accounting.
    pub fn with_accounting(self, accounting: Accounting) -> Self {
        MemoryConfig { accounting, ..self }
    }

    /// Stages of the pipeline, `pp * v`.
    pub fn stages(&self) -> u32 {
        self.pp.saturating_mul(self.v)
    }

    /// Checks the expert layout against the shape and the mesh, naming the field.
    fn check_experts(&self) -> Result<(), MemoryError> {
        let e = &self.experts;
        if !(e.capacity.is_finite() && e.capacity >= 1.0) {
            return Err(MemoryError::Capacity(e.capacity));
        }
        let Some(m) = self.shape.moe else {
            return match (e.ep, e.etp) {
                (1, 1) => Ok(()),
                (1, _) => Err(MemoryError::NoExperts("etp")),
                _ => Err(MemoryError::NoExperts("ep")),
            };
        };
        for (name, x) in [("ep", e.ep), ("etp", e.etp)] {
            if x == 0 {
                return Err(MemoryError::NotPositive(name));
            }
        }
        if m.experts % e.ep != 0 {
            return Err(MemoryError::NotDividing {
                a: "ep",
                x: e.ep.into(),
                b: "experts",
                y: m.experts.into(),
            });
        }
        let group = u64::from(self.tp) * u64::from(self.dp);
        let fold = u64::from(e.ep) * u64::from(e.etp);
        if group % fold != 0 {
            return Err(MemoryError::NotDividing {
                a: "ep x etp",
                x: fold,
                b: "tp x dp",
                y: group,
            });
        }
        if m.expert_ffn % u64::from(e.etp) != 0 {
            return Err(MemoryError::NotDividing {
                a: "etp",
                x: e.etp.into(),
                b: "expert_ffn",
                y: m.expert_ffn,
            });
        }
        Ok(())
    }

    /// Checks the sizes against each other, naming the first that does not fit.
    pub fn check(&self) -> Result<(), MemoryError> {
        let s = &self.shape;
        s.check().map_err(MemoryError::from)?;
        // The Megatron accounting counts mixtures, latent attention and heads of their own
        // width; pipewright's counts its reference GPT's stashes, which has a mixture of
        // experts but none of the others.
        let without_moe = ModelShape { moe: None, ..*s };
        if let (Some(what), Accounting::Pipewright) = (without_moe.not_modelled(), self.accounting)
        {
            return Err(MemoryError::NotReference(
                what.trim_start_matches("a ").into(),
            ));
        }
        self.check_experts()?;
        let positive = [
            ("pp", u64::from(self.pp)),
            ("tp", u64::from(self.tp)),
            ("dp", u64::from(self.dp)),
            ("v", u64::from(self.v)),
            ("microbatch_size", self.microbatch_size),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, x)| *x == 0) {
            return Err(MemoryError::NotPositive(name));
        }
        let tp = u64::from(self.tp);
        // Megatron-LM splits key/value heads over TP too (each rank holds
        // `kv_heads / tp` of them), so tp divides both head counts.
        let divides = [
            ("tp", "heads", tp, u64::from(s.heads)),
            ("tp", "kv_heads", tp, u64::from(s.kv_heads)),
            ("tp", "ffn", tp, s.ffn),
        ];
        for (a, b, x, y) in divides {
            if y % x != 0 {
                return Err(MemoryError::NotDividing { a, x, b, y });
            }
        }
        if self.sequence_parallel && s.seq_len % tp != 0 {
            return Err(MemoryError::NotDividing {
                a: "tp",
                x: tp,
                b: "seq_len",
                y: s.seq_len,
            });
        }
        if self.stages() > s.layers {
            return Err(MemoryError::TooManyStages {
                stages: self.stages(),
                layers: s.layers,
            });
        }
        if self.zero > 1 {
            return Err(MemoryError::Zero(self.zero));
        }
        if self.accounting == Accounting::Pipewright {
            pipewright::check_shape(s)?;
            pipewright::check_mixture(self)?;
        }
        self.recompute
            .check(self.stages())
            .map_err(|e| MemoryError::Recompute(e.to_string()))
    }
}

/// Why a prediction cannot be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MemoryError {
    /// A shape whose sizes do not fit each other.
    #[error("memory model: {0}")]
    Shape(#[from] crate::shape::ShapeError),
    /// A shape pipewright's reference GPT cannot take (its accounting counts that model's
    /// stashes exactly, so it counts no other).
    #[error("memory model: the pipewright accounting counts the reference GPT's stashes, which has no {0}; use the megatron accounting")]
    NotReference(String),
    /// A shape with parts the memory model does not count yet.
    #[error("memory model: {0} is not modelled yet (its parameters, FLOPs and config are read; its memory is not)")]
    NotModelled(&'static str),
    /// A capacity factor below 1 or not finite.
    #[error("memory model: capacity_factor must be a finite number at least 1 (got {0})")]
    Capacity(f64),
    /// Expert parallelism asked of a model without experts.
    #[error(
        "memory model: {0} above 1 needs a mixture of experts; the model has no routed experts"
    )]
    NoExperts(&'static str),
    /// A size that must be at least 1.
    #[error("memory model: {0} must be positive")]
    NotPositive(&'static str),
    /// A size that must divide another.
    #[error("memory model: {a} ({x}) must divide {b} ({y})")]
    NotDividing {
        /// The divisor's name.
        a: &'static str,
        /// The divisor.
        x: u64,
        /// The dividend's name.
        b: &'static str,
        /// The dividend.
        y: u64,
    },
    /// More stages than blocks.
    #[error("memory model: {stages} stages (pp * v) need at least {stages} layers, the model has {layers}")]
    TooManyStages {
        /// Stages, `pp * v`.
        stages: u32,
        /// Blocks of the model.
        layers: u32,
    },
    /// A ZeRO level other than 0 or 1.
    #[error("memory model: ZeRO-{0} is not modelled (levels 0 and 1 are; 2 and 3 cannot run with a pipeline)")]
    Zero(u8),
    /// A timetable whose sends and receives cannot be placed.
    #[error("memory model: {0}")]
    Lower(String),
    /// A recompute plan naming stages the pipeline lacks.
    #[error("memory model: {0}")]
    Recompute(String),
    /// A timetable that is not of this configuration's pipeline.
    #[error("memory model: the timetable has {got} devices and {got_stages} stages, the configuration {want} devices and {want_stages} stages (pp * v)")]
    Timetable {
        /// Devices of the timetable.
        got: u32,
        /// Stages of the timetable.
        got_stages: u32,
        /// `pp`.
        want: u32,
        /// `pp * v`.
        want_stages: u32,
    },
}

/// Per-layer activation bytes of one microbatch on one TP rank, under `policy`: the
/// published formulas (Megatron accounting) or one block's stash of pipewright's GPT (with
/// `Every(n)`, a layer the policy recomputes: the layer input under Megatron, nothing under
/// pipewright, whose kept stage input is counted per stage).
pub fn layer_activation_bytes(cfg: &MemoryConfig, policy: Recompute) -> u64 {
    match cfg.accounting {
        Accounting::Megatron => megatron::layer_bytes(cfg, policy),
        Accounting::Pipewright => pipewright::layer_bytes(cfg, policy),
    }
}

/// One pipeline device's predicted memory, as the runtime measures a rank's
/// (`pipewright_runtime::RankMemory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicePrediction {
    /// The holdings at the moment of the highest total (the earliest such moment).
    pub peak: MemoryBreakdown,
    /// Each category's own maximum (of different moments).
    pub max: MemoryBreakdown,
}

/// Per pipeline device, its ranks' memory by category at the moment of their highest total
/// (see [`predict_detail`]).
pub fn predict(cfg: &MemoryConfig, tt: &Timetable) -> Result<Vec<MemoryBreakdown>, MemoryError> {
    Ok(predict_detail(cfg, tt)?
        .into_iter()
        .map(|d| d.peak)
        .collect())
}

/// Per pipeline device, its ranks' memory by category: all `tp x dp` ranks of one device are
/// alike, except that ZeRO-1 shards round up (to the first DP rank's, which this is).
/// Parameters, gradients and optimizer state are those of a step after the first (AdamW's
/// state exists); activations and buffers come from one walk of the device's actions in the
/// runtime's order (`timeline`), so the peak is the highest sum over time, not a sum of
/// maxima. As in the runtime, a stage with `R` actions in `tt` and no policy in `cfg`
/// recomputes fully. Workspace (temporaries inside one layer's compute) is not modelled, as
/// the runtime does not count it on the host: 0.
pub fn predict_detail(
    cfg: &MemoryConfig,
    tt: &Timetable,
) -> Result<Vec<DevicePrediction>, MemoryError> {
    let (cfg, stages, buffers) =
        &prepare(cfg, tt, &pipewright_schedule::recompute::recomputed(tt))?;
    let low = if tt.is_lowered() {
        tt.clone()
    } else {
        pipewright_schedule::timetable::lower(tt).map_err(|e| MemoryError::Lower(e.to_string()))?
    };
    let mut devices = walk_devices(&low, stages, buffers, |d| params::device_state(cfg, tt, d));
    if cfg.accounting == Accounting::Megatron && cfg.shape.moe.is_some() {
        add_dispatch_buffers(cfg, tt, &mut devices);
    }
    Ok(devices)
}

/// `cfg` checked against itself and `tt` (whose stages with `R` actions are `recomputed`),
/// with those stages recomputing fully where `cfg` has no policy for them; and what each
/// stage's microbatch and each buffer hold under it.
fn prepare(
    cfg: &MemoryConfig,
    tt: &Timetable,
    recomputed: &std::collections::BTreeSet<u32>,
) -> Result<(MemoryConfig, Vec<StageBytes>, timeline::BufferBytes), MemoryError> {
    cfg.check()?;
    let mut plan = cfg.recompute.clone();
    for &s in recomputed {
        if plan.of(s) == Recompute::None {
            plan.stages.insert(s, Recompute::Full);
        }
    }
    let cfg = MemoryConfig {
        recompute: plan,
        ..cfg.clone()
    };
    if tt.num_devices() != cfg.pp || tt.num_stages() != cfg.stages() {
        return Err(MemoryError::Timetable {
            got: tt.num_devices(),
            got_stages: tt.num_stages(),
            want: cfg.pp,
            want_stages: cfg.stages(),
        });
    }
    let stages: Vec<StageBytes> = (0..cfg.stages())
        .map(|s| match cfg.accounting {
            Accounting::Megatron => megatron::stage_bytes(&cfg, s),
            Accounting::Pipewright => pipewright::stage_bytes(&cfg, s),
        })
        .collect();
    let buffers = buffer_bytes(&cfg);
    Ok((cfg, stages, buffers))
}

/// An MoE layer's dispatch buffers live while it dispatches, in a forward or a backward: a
/// device's peak (at the end of a forward or during a backward) is counted with the largest
/// of its stages' buffers beside it (an upper bound where the peak falls elsewhere).
fn add_dispatch_buffers(cfg: &MemoryConfig, tt: &Timetable, devices: &mut [DevicePrediction]) {
    for (d, dev) in devices.iter_mut().enumerate() {
        let most = dispatch_most(cfg, tt, d as u32);
        dev.peak.buffers = dev.peak.buffers.saturating_add(most);
        dev.max.buffers = dev.max.buffers.saturating_add(most);
    }
}

/// The largest dispatch buffers of device `d`'s stages (0 but for a mixture under the
/// Megatron accounting).
fn dispatch_most(cfg: &MemoryConfig, tt: &Timetable, d: u32) -> u64 {
    if cfg.accounting != Accounting::Megatron || cfg.shape.moe.is_none() {
        return 0;
    }
    (0..tt.num_stages())
        .filter(|&s| tt.device_of(s) == Some(d))
        .map(|s| megatron::dispatch_bytes(cfg, s))
        .max()
        .unwrap_or(0)
}

/// Each device of the lowered `low`: its activations and buffers from one walk of its row,
/// with `state(d)` (parameters, gradients, optimizer state) held throughout.
fn walk_devices(
    low: &Timetable,
    stages: &[StageBytes],
    buffers: &timeline::BufferBytes,
    state: impl Fn(u32) -> MemoryBreakdown,
) -> Vec<DevicePrediction> {
    (0..low.num_devices())
        .map(|d| {
            let row = &low.devices[d as usize];
            let levels = timeline::device_levels(row, low.num_stages(), stages, buffers);
            let state = state(d);
            let (act, buf) = levels.peak;
            DevicePrediction {
                peak: MemoryBreakdown {
                    activations: act.round() as u64,
                    buffers: buf.round() as u64,
                    ..state
                },
                max: MemoryBreakdown {
                    activations: levels.max_activations.round() as u64,
                    buffers: levels.max_buffers.round() as u64,
                    ..state
                },
            }
        })
        .collect()
}

/// What the buffers of `cfg` are made of. Pipewright reduces a copy of each stage's flat f32
/// gradients (and under ZeRO-1 holds the rank's shard of them); Megatron reduces in place in
/// its contiguous gradient buffer and gathers into its parameter buffer, so only its
/// hand-offs count.
fn buffer_bytes(cfg: &MemoryConfig) -> timeline::BufferBytes {
    let handoff = match cfg.accounting {
        Accounting::Megatron => megatron::handoff_bytes(cfg),
        Accounting::Pipewright => pipewright::handoff_bytes(cfg),
    } as f64;
    let dp = u64::from(cfg.dp.max(1));
    let reduced = cfg.accounting == Accounting::Pipewright && dp > 1;
    let numel = |s| params::rank_parameters(cfg, s);
    let grads = (0..cfg.stages())
        .map(|s| if reduced { (4 * numel(s)) as f64 } else { 0.0 })
        .collect();
    let shards = (reduced && cfg.zero >= 1).then(|| {
        (0..cfg.stages())
            .map(|s| (4 * numel(s).div_ceil(dp)) as f64)
            .collect()
    });
    timeline::BufferBytes {
        handoff,
        outputs: None,
        grads,
        shards,
    }
}

#[cfg(test)]
mod tests;
