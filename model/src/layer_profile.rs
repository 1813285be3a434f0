//! A layer-list model as measured: per layer its forward, input-backward and weight-backward
//! times, its parameters, and the bytes it keeps (its forward stash, its weight stash from I
//! to W) and hands on (its output), for one microbatch of a given size. The runtime's
//! profiling pass writes it (`pipewright_runtime::split::layer_profile`); `pipewright plan
//! --profile FILE` plans from it.
//!
//! The JSON file form (version 1; times in milliseconds, sizes in bytes of one microbatch of
//! `microbatch_size` samples; `flops`, the layer's forward FLOPs of such a microbatch, is
//! optional but all layers or none):
//!
//! ```json
//! { "version": 1, "microbatch_size": 16, "device": "cpu (16 threads)",
//!   "layers": [ { "f_ms": 0.2, "i_ms": 0.2, "w_ms": 0.1, "params": 4160,
//!                 "param_bytes": 16640, "stash_bytes": 4096, "weight_stash_bytes": 4096,
//!                 "output_bytes": 2048 } ] }
//! ```
//!
//! `tp` (optional, 1 when absent) is the tensor-parallel degree the layers were measured
//! at: a layer list built from TP rank 0's `TpShard` of `tp` holds one rank's shard, so its
//! parameter, stash and weight-stash bytes are per TP rank, and `plan --profile` plans that
//! `tp` (and no other) from them. Its times are one rank's compute, without the TP
//! all-reduces.
//!
//! Read in two steps, like every file here: [`RawLayerProfile`] is what serde accepts (a bad
//! JSON text is named by line and column), [`LayerProfile::from_raw`] checks it (a bad value
//! is named by layer index and field).

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// The file format's version this crate reads and writes.
pub const PROFILE_VERSION: u32 = 1;

/// One layer as written in the file, every field optional until checked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLayer {
    /// Forward, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f_ms: Option<f64>,
    /// Input backward (I), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub i_ms: Option<f64>,
    /// Weight backward (W), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_ms: Option<f64>,
    /// Parameters (elements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<u64>,
    /// Bytes of the parameters' values (the gradients are counted the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_bytes: Option<u64>,
    /// Bytes the forward's stash keeps until the backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stash_bytes: Option<u64>,
    /// Bytes the input backward keeps until the weight backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_stash_bytes: Option<u64>,
    /// Bytes of the layer's output (the hand-off when a stage ends here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Forward FLOPs of one microbatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
}

/// A profile as written in the file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLayerProfile {
    /// [`PROFILE_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Samples per microbatch it was measured at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatch_size: Option<u64>,
    /// Where it was measured (free text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The tensor-parallel degree its layers were measured at (1 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// The layers, in model order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<RawLayer>>,
}

/// One checked layer (times in ms, sizes in bytes, of one microbatch of the profile's size).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfiledLayer {
    /// Forward.
    pub f_ms: f64,
    /// Input backward.
    pub i_ms: f64,
    /// Weight backward.
    pub w_ms: f64,
    /// Parameters (elements).
    pub params: u64,
    /// Bytes of the parameters' values.
    pub param_bytes: u64,
    /// Forward stash.
    pub stash_bytes: u64,
    /// Weight stash (I to W).
    pub weight_stash_bytes: u64,
    /// Output.
    pub output_bytes: u64,
    /// Forward FLOPs, where known.
    pub flops: Option<f64>,
}

/// A checked profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Samples per microbatch it was measured at (at least 1).
    pub microbatch_size: u64,
    /// Where it was measured.
    pub device: String,
    /// The tensor-parallel degree its layers were measured at: their bytes are one TP
    /// rank's (1: the whole layers).
    pub tp: u32,
    /// At least one layer.
    pub layers: Vec<ProfiledLayer>,
}

/// Why a profile cannot be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// Not valid JSON for a profile.
    #[error("profile, line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde's message.
        message: String,
    },
    /// A top-level field missing or out of range.
    #[error("profile: {0}")]
    Top(String),
    /// A layer's field missing or out of range.
    #[error("profile: layer {layer}: {field} {problem}")]
    Layer {
        /// The layer's index (0-based).
        layer: usize,
        /// Which field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl LayerProfile {
    /// Parse and check a profile's JSON text.
    pub fn from_json(text: &str) -> Result<LayerProfile, ProfileError> {
        let raw: RawLayerProfile = serde_json::from_str(text).map_err(|e| ProfileError::Json {
            line: e.line(),
            column: e.column(),
            message: pipewright_schedule::formats::without_position(&e),
        })?;
        LayerProfile::from_raw(raw)
    }

    /// Check a profile as written.
    pub fn from_raw(raw: RawLayerProfile) -> Result<LayerProfile, ProfileError> {
        match raw.version {
            Some(PROFILE_VERSION) => {}
            Some(v) => {
                return Err(ProfileError::Top(format!(
                    "version {v} is not known (this build reads version {PROFILE_VERSION})"
                )))
            }
            None => return Err(ProfileError::Top("version is missing".into())),
        }
        let microbatch_size = match raw.microbatch_size {
            Some(0) => {
                return Err(ProfileError::Top(
                    "microbatch_size must be at least 1".into(),
                ))
            }
            Some(b) if b > MAX_MICROBATCH => {
                return Err(ProfileError::Top(format!(
                    "microbatch_size {b} is more than 2^30 ({MAX_MICROBATCH}) samples"
                )))
            }
            Some(b) => b,
            None => return Err(ProfileError::Top("microbatch_size is missing".into())),
        };
        let tp = match raw.tp {
            None => 1,
            Some(t) if (1..=MAX_TP).contains(&t) => t,
            Some(t) => {
                return Err(ProfileError::Top(format!(
                    "tp {t} must be from 1 to {MAX_TP} (the TP degree the layers were measured at)"
                )))
            }
        };
        let raws = raw.layers.unwrap_or_default();
        if raws.is_empty() {
            return Err(ProfileError::Top("layers is missing or empty".into()));
        }
        let layers = raws
            .iter()
            .enumerate()
            .map(|(k, l)| check_layer(k, l))
            .collect::<Result<Vec<_>, _>>()?;
        let with_flops = layers.iter().filter(|l| l.flops.is_some()).count();
        if with_flops != 0 && with_flops != layers.len() {
            let k = layers.iter().position(|l| l.flops.is_none()).unwrap_or(0);
            return Err(ProfileError::Layer {
                layer: k,
                field: "flops",
                problem: "is missing (give flops for every layer or for none)".into(),
            });
        }
        check_totals(&layers)?;
        let p = LayerProfile {
            microbatch_size,
            device: raw.device.unwrap_or_else(|| "unknown".into()),
            tp,
            layers,
        };
        if p.layers.iter().map(ProfiledLayer::time_ms).sum::<f64>() <= 0.0 {
            return Err(ProfileError::Top(
                "every layer's time is 0: nothing to balance or plan".into(),
            ));
        }
        Ok(p)
    }

    /// The file form of this profile.
    pub fn to_raw(&self) -> RawLayerProfile {
        let layers = self
            .layers
            .iter()
            .map(|l| RawLayer {
                f_ms: Some(l.f_ms),
                i_ms: Some(l.i_ms),
                w_ms: Some(l.w_ms),
                params: Some(l.params),
                param_bytes: Some(l.param_bytes),
                stash_bytes: Some(l.stash_bytes),
                weight_stash_bytes: Some(l.weight_stash_bytes),
                output_bytes: Some(l.output_bytes),
                flops: l.flops,
            })
            .collect();
        RawLayerProfile {
            version: Some(PROFILE_VERSION),
            microbatch_size: Some(self.microbatch_size),
            device: Some(self.device.clone()),
            tp: (self.tp != 1).then_some(self.tp),
            layers: Some(layers),
        }
    }

    /// Write the profile's JSON file form to `path` (what `pipewright plan --profile`
    /// reads), all or nothing: into a new temporary file beside it, then renamed over it, so
    /// a failed write leaves what was there. The error names the file.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let named = |e: std::io::Error, p: &std::path::Path| {
            std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
        };
        let mut text = serde_json::to_vec_pretty(&self.to_raw()).map_err(std::io::Error::other)?;
        text.push(b'\n');
        let name = path.file_name().ok_or_else(|| {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name");
            named(e, path)
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&text).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(named(e, path));
        }
        Ok(())
    }

    /// `"f32"` or `"bf16"`: the number format of the profile's weights, from its bytes per
    /// parameter (4 or more: f32), which is what `pipewright plan --profile` plans them in.
    pub fn weight_format(&self) -> &'static str {
        let params: u64 = self.layers.iter().map(|l| l.params).sum();
        let bytes: u64 = self.layers.iter().map(|l| l.param_bytes).sum();
        if params == 0 || bytes >= 4 * params {
            "f32"
        } else {
            "bf16"
        }
    }

    /// Layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Never: a checked profile has a layer.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The contiguous cuts into `stages` stages that balance forward + backward time (the
    /// runtime's `Balance::Time` cut of these times); `None` when there are fewer layers.
    pub fn cuts(&self, stages: usize) -> Option<Vec<Range<usize>>> {
        let times: Vec<f64> = self.layers.iter().map(ProfiledLayer::time_ms).collect();
        balanced(&times, stages)
    }

    /// Total forward FLOPs of one microbatch, where every layer gives them.
    pub fn forward_flops(&self) -> Option<f64> {
        self.layers.iter().map(|l| l.flops).sum()
    }
}

impl ProfiledLayer {
    /// Forward plus both backwards.
    pub fn time_ms(&self) -> f64 {
        self.f_ms + self.i_ms + self.w_ms
    }
}

/// The largest total over all layers of a size field (parameters, or bytes: a pebibyte).
/// The memory model sums these, times 8 bytes of AdamW state per parameter, in `u64`.
pub const MAX_TOTAL: u64 = 1 << 50;

/// Sums over all layers that stay in range: finite times and FLOPs (a sum of finite times
/// can overflow to infinity, and cuts balancing infinite loads are empty), sizes up to
/// [`MAX_TOTAL`].
fn check_totals(layers: &[ProfiledLayer]) -> Result<(), ProfileError> {
    if !layers
        .iter()
        .map(ProfiledLayer::time_ms)
        .sum::<f64>()
        .is_finite()
    {
        return Err(ProfileError::Top(
            "the layers' times sum past the largest number (f_ms + i_ms + w_ms over all layers must be finite)".into(),
        ));
    }
    if !layers
        .iter()
        .filter_map(|l| l.flops)
        .sum::<f64>()
        .is_finite()
    {
        return Err(ProfileError::Top(
            "the layers' flops sum past the largest number".into(),
        ));
    }
    type Field = (&'static str, fn(&ProfiledLayer) -> u64);
    let fields: [Field; 5] = [
        ("params", |l| l.params),
        ("param_bytes", |l| l.param_bytes),
        ("stash_bytes", |l| l.stash_bytes),
        ("weight_stash_bytes", |l| l.weight_stash_bytes),
        ("output_bytes", |l| l.output_bytes),
    ];
    for (field, pick) in fields {
        let mut total = 0u64;
        for (k, l) in layers.iter().enumerate() {
            total = total.saturating_add(pick(l));
            if total > MAX_TOTAL {
                return Err(ProfileError::Layer {
                    layer: k,
                    field,
                    problem: format!("makes the layers' total more than 2^50 ({MAX_TOTAL})"),
                });
            }
        }
    }
    Ok(())
}

/// A layer's measured time, ms, when not 0: from a nanosecond to about three hours (a
/// figure outside it is in another unit, or not a measurement).
pub const TIME_MS: (f64, f64) = (1e-6, 1e7);

/// A layer's forward FLOPs of one microbatch, when not 0: from 1 to 1e21 (a thousand times a
/// trillion-parameter model's layer over a million tokens).
pub const FLOPS: (f64, f64) = (1.0, 1e21);

/// The largest TP degree a profile can be measured at (a TP group within a node of 1024 GPUs).
pub const MAX_TP: u32 = 1024;

/// The most samples a profile's microbatch can hold (the plan's largest global batch, 2^30).
pub const MAX_MICROBATCH: u64 = 1 << 30;

/// `x` is 0 or within `range`.
fn in_range(x: f64, (lo, hi): (f64, f64)) -> bool {
    x == 0.0 || (x >= lo && x <= hi)
}

fn check_layer(k: usize, l: &RawLayer) -> Result<ProfiledLayer, ProfileError> {
    let bad = |field: &'static str, problem: String| ProfileError::Layer {
        layer: k,
        field,
        problem,
    };
    let time = |field: &'static str, v: Option<f64>| match v {
        None => Err(bad(field, "is missing".into())),
        Some(t) if !in_range(t, TIME_MS) => Err(bad(
            field,
            format!(
                "must be 0 or from {} to {} ms, as a layer can take (got {t})",
                TIME_MS.0, TIME_MS.1
            ),
        )),
        Some(t) => Ok(t),
    };
    let size =
        |field: &'static str, v: Option<u64>| v.ok_or_else(|| bad(field, "is missing".into()));
    let flops = match l.flops {
        Some(f) if !in_range(f, FLOPS) => {
            return Err(bad(
                "flops",
                format!(
                    "must be 0 or from {} to {:e}, as a layer's forward can do (got {f})",
                    FLOPS.0, FLOPS.1
                ),
            ))
        }
        f => f,
    };
    let params = size("params", l.params)?;
    let param_bytes = size("param_bytes", l.param_bytes)?;
    if (params == 0) != (param_bytes == 0) {
        return Err(bad(
            "param_bytes",
            format!("({param_bytes}) and params ({params}) must both be 0 or both positive"),
        ));
    }
    Ok(ProfiledLayer {
        f_ms: time("f_ms", l.f_ms)?,
        i_ms: time("i_ms", l.i_ms)?,
        w_ms: time("w_ms", l.w_ms)?,
        params,
        param_bytes,
        stash_bytes: size("stash_bytes", l.stash_bytes)?,
        weight_stash_bytes: size("weight_stash_bytes", l.weight_stash_bytes)?,
        output_bytes: size("output_bytes", l.output_bytes)?,
        flops,
    })
}

/// Contiguous non-empty ranges of `weights` whose largest sum is the least possible (exact,
/// by dynamic programming over cut points: `stages * n^2` steps, for lists of layers);
/// `None` when `stages` is 0 or exceeds the weights. Negative weights count as 0.
pub fn balanced(weights: &[f64], stages: usize) -> Option<Vec<Range<usize>>> {
    let n = weights.len();
    if stages == 0 || n < stages {
        return None;
    }
    let mut prefix = vec![0.0; n + 1];
    for (i, w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + w.max(0.0);
    }
    // best[j][i]: least largest load of the first i layers in j + 1 stages; cut[j][i]: where
    // the last of those stages starts.
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages];
    let mut cut = vec![vec![0; n + 1]; stages];
    best[0][1..].copy_from_slice(&prefix[1..]);
    for j in 1..stages {
        for i in j + 1..=n {
            for t in j..i {
                let load = best[j - 1][t].max(prefix[i] - prefix[t]);
                if load < best[j][i] {
                    (best[j][i], cut[j][i]) = (load, t);
                }
            }
        }
    }
    let mut ranges = vec![0..0; stages];
    let mut end = n;
    for j in (0..stages).rev() {
        let start = if j == 0 { 0 } else { cut[j][end] };
        ranges[j] = start..end;
        end = start;
    }
    Some(ranges)
}

#[cfg(test)]
mod tests;
