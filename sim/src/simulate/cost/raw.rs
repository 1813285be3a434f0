//! The cost file as written: every field optional, resolved into [`StageCost`]s and a
//! [`CostModel`] with one clear refusal per bad value.

use serde::{Deserialize, Serialize};

use super::{check, CostError, CostModel, Place, StageCost};
use crate::simulate::host::{HostCosts, Runtime};

/// A stage's costs as written in a cost file: any field may be left to the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStageCost {
    /// Forward time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f: Option<f64>,
    /// Full backward time (default `i + w`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<f64>,
    /// Input-gradient time (default `b - w`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub i: Option<f64>,
    /// Weight-gradient time (default `b - i`, or `b / 2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<f64>,
    /// All-to-all time inside the forward, beside `f` (default 0; see [`StageCost::f_comm`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f_comm: Option<f64>,
    /// All-to-all time inside the backward, B or I, beside `b` and `i` (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_comm: Option<f64>,
    /// Stashed activation bytes (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_bytes: Option<u64>,
    /// Fraction of the activations held after I until W, in [0, 1] (default 1: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_memory: Option<f64>,
    /// Bytes sent to the next stage (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_bytes: Option<u64>,
    /// Time of the hand-off to the next stage (default: the link model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_time: Option<f64>,
    /// Time of an F&B overlap whose forward is this stage's, as measured (default:
    /// [`overlap_time`](super::overlap_time), F plus the B's time when neither communicates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<f64>,
    /// Optimizer step time per training step (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<f64>,
    /// Data-parallel gradient all-reduce time per training step (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_allreduce: Option<f64>,
    /// Recompute (`R`) time (default: `f`, a full recompute reruns the forward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r: Option<f64>,
    /// Communication inside a recompute (default: `f_comm`, a full recompute reruns it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_comm: Option<f64>,
    /// Bytes a recomputed microbatch keeps from F to R (default: the previous stage's
    /// `p2p_bytes`, the stage's input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_bytes: Option<u64>,
}

impl From<&StageCost> for RawStageCost {
    /// Every field as the stage has it: the file resolves to the same stage.
    fn from(c: &StageCost) -> RawStageCost {
        let nonzero = |x: f64| (x != 0.0).then_some(x);
        RawStageCost {
            f: Some(c.f),
            b: Some(c.b),
            i: Some(c.i),
            w: Some(c.w),
            f_comm: nonzero(c.f_comm),
            b_comm: nonzero(c.b_comm),
            activation_bytes: (c.activation_bytes != 0).then_some(c.activation_bytes),
            w_memory: (c.w_memory != 1.0).then_some(c.w_memory),
            p2p_bytes: Some(c.p2p_bytes),
            p2p_time: c.p2p_time,
            overlap: c.overlap,
            optimizer: nonzero(c.optimizer),
            dp_allreduce: nonzero(c.dp_allreduce),
            r: c.r,
            r_comm: c.r_comm,
            kept_bytes: c.kept_bytes,
        }
    }
}

impl RawStageCost {
    /// Whether nothing is given (every field left to its default).
    pub fn is_empty(&self) -> bool {
        *self == RawStageCost::default()
    }

    fn or(self, d: RawStageCost) -> RawStageCost {
        RawStageCost {
            f: self.f.or(d.f),
            b: self.b.or(d.b),
            i: self.i.or(d.i),
            w: self.w.or(d.w),
            f_comm: self.f_comm.or(d.f_comm),
            b_comm: self.b_comm.or(d.b_comm),
            activation_bytes: self.activation_bytes.or(d.activation_bytes),
            w_memory: self.w_memory.or(d.w_memory),
            p2p_bytes: self.p2p_bytes.or(d.p2p_bytes),
            p2p_time: self.p2p_time.or(d.p2p_time),
            overlap: self.overlap.or(d.overlap),
            optimizer: self.optimizer.or(d.optimizer),
            dp_allreduce: self.dp_allreduce.or(d.dp_allreduce),
            r: self.r.or(d.r),
            r_comm: self.r_comm.or(d.r_comm),
            kept_bytes: self.kept_bytes.or(d.kept_bytes),
        }
    }

    /// The stage's costs. `apart`: the file's backward was measured split and fused apart
    /// (PyTorch's runtime), so `i + w` may differ from `b`; elsewhere a stage with all three
    /// must add up, since the simulator would time a split schedule by `i + w` and a fused
    /// one by `b`.
    pub(super) fn resolve(self, place: &Place, apart: bool) -> Result<StageCost, CostError> {
        let f = self.f.ok_or(missing(place, "f"))?;
        let (b, i, w) = self.backward(place, apart)?;
        let w_memory = self.w_memory.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&w_memory) {
            return Err(CostError::WMemory {
                place: place.clone(),
                value: w_memory,
            });
        }
        let cost = StageCost {
            f,
            b,
            i,
            w,
            f_comm: self.f_comm.unwrap_or(0.0),
            b_comm: self.b_comm.unwrap_or(0.0),
            activation_bytes: self.activation_bytes.unwrap_or(0),
            w_memory,
            p2p_bytes: self.p2p_bytes.unwrap_or(0),
            p2p_time: self.p2p_time,
            overlap: self.overlap,
            optimizer: self.optimizer.unwrap_or(0.0),
            dp_allreduce: self.dp_allreduce.unwrap_or(0.0),
            r: self.r,
            r_comm: self.r_comm,
            kept_bytes: self.kept_bytes,
        };
        check_times(&cost, place)?;
        Ok(cost)
    }

    /// The full backward and its two parts, from those given: two of `b`, `i`, `w` give
    /// the third, `b` alone splits in half. A part larger than the whole, or three that do
    /// not add up (outside `apart`), is refused naming the field.
    fn backward(&self, place: &Place, apart: bool) -> Result<(f64, f64, f64), CostError> {
        let (b, i, w) = match (self.b, self.i, self.w) {
            (Some(b), Some(i), Some(w)) => (b, i, w),
            (Some(b), Some(i), None) => (b, i, b - i),
            (Some(b), None, Some(w)) => (b, b - w, w),
            (Some(b), None, None) => (b, b / 2.0, b / 2.0),
            (None, Some(i), Some(w)) => (i + w, i, w),
            _ => return Err(missing(place, "b, or i and w")),
        };
        // A part larger than the whole would make the other part negative: say which.
        for (part, value) in [("w", self.w), ("i", self.i)] {
            match (value, self.b) {
                (Some(x), Some(b)) if x > b && (self.i.is_none() || self.w.is_none()) => {
                    return Err(CostError::PartOverWhole {
                        place: place.clone(),
                        part,
                        value: x,
                        b,
                    })
                }
                _ => {}
            }
        }
        if let (Some(b), Some(i), Some(w)) = (self.b, self.i, self.w) {
            if !apart && (i + w - b).abs() > 1e-9 * b.abs().max(1e-300) {
                return Err(CostError::SplitMismatch {
                    place: place.clone(),
                    i,
                    w,
                    b,
                });
            }
        }
        Ok((b, i, w))
    }
}

fn missing(place: &Place, what: &'static str) -> CostError {
    CostError::Missing {
        place: place.clone(),
        what,
    }
}

/// Refuse a negative or non-finite time, naming the stage and the field.
fn check_times(c: &StageCost, place: &Place) -> Result<(), CostError> {
    let all = [
        ("f", c.f),
        ("b", c.b),
        ("i", c.i),
        ("w", c.w),
        ("f_comm", c.f_comm),
        ("b_comm", c.b_comm),
        ("overlap", c.overlap.unwrap_or(0.0)),
        ("optimizer", c.optimizer),
        ("dp_allreduce", c.dp_allreduce),
        ("r", c.r.unwrap_or(0.0)),
        ("r_comm", c.r_comm.unwrap_or(0.0)),
        ("p2p_time", c.p2p_time.unwrap_or(0.0)),
    ];
    for (what, v) in all {
        check(what, v).map_err(|_| CostError::InvalidAt {
            place: place.clone(),
            what,
            value: v,
        })?;
    }
    Ok(())
}

/// A cost file: `default` applies to every stage, `stages` (one entry per stage) overrides it.
/// A list of another length is cut or joined to the timetable's stages (see
/// [`CostModel::resample`]): costs of a 4-device pipeline serve one of 4 devices with 2 chunks.
///
/// ```json
/// { "default": { "f": 1.0, "b": 2.0, "w": 1.0, "activation_bytes": 4096, "w_memory": 0.4,
///                "p2p_bytes": 1024, "overlap": 2.5, "optimizer": 0.5, "dp_allreduce": 0.2,
///                "f_comm": 0.25, "b_comm": 0.5 },
///   "stages": [ {}, {}, {}, { "f": 1.5, "b": 3.0 } ],
///   "p2p_latency": 0.05, "bandwidth": 1e6 }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCostFile {
    /// Costs of every stage unless overridden.
    #[serde(default, skip_serializing_if = "RawStageCost::is_empty")]
    pub default: RawStageCost,
    /// Per-stage overrides; when present, exactly one per stage.
    #[serde(default)]
    pub stages: Option<Vec<RawStageCost>>,
    /// Latency of each point-to-point transfer (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_latency: Option<f64>,
    /// Link bandwidth in bytes per time unit (default infinite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<f64>,
    /// Unit of the times, for people (e.g. `ms` in a measured file); not used in arithmetic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_unit: Option<String>,
    /// Where the costs come from, for people (e.g. the run that measured them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Host time per action and per message, and whose runtime it is (default: none, and
    /// pipewright's runtime). See [`host`](crate::simulate::host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostCosts>,
}

impl RawCostFile {
    /// A measured file: one entry per stage of its forward, input-backward and
    /// weight-backward milliseconds `[f, i, w]` (B = I + W), e.g. a profiled layer list's
    /// stages (`pipewright_runtime::split::stage_costs`), for `search --costs` or
    /// `simulate --costs`.
    pub fn from_stage_ms(
        stages: impl IntoIterator<Item = [f64; 3]>,
        source: String,
    ) -> RawCostFile {
        let stage = |[f, i, w]: [f64; 3]| RawStageCost {
            f: Some(f),
            b: Some(i + w),
            i: Some(i),
            w: Some(w),
            ..RawStageCost::default()
        };
        RawCostFile {
            stages: Some(stages.into_iter().map(stage).collect()),
            time_unit: Some("ms".into()),
            source: Some(source),
            ..RawCostFile::default()
        }
    }

    /// `model` as a cost file, one entry per stage, that resolves to `model` again (so a
    /// planner's predicted costs can be simulated, searched and drawn like measured ones).
    pub fn from_model(model: &CostModel, time_unit: &str, source: String) -> RawCostFile {
        RawCostFile {
            default: RawStageCost::default(),
            stages: Some(model.stages.iter().map(RawStageCost::from).collect()),
            p2p_latency: Some(model.p2p_latency),
            bandwidth: model.bandwidth,
            time_unit: Some(time_unit.to_string()),
            source: Some(source),
            host: model.host,
        }
    }

    /// Resolve for a timetable with `stages` stages.
    pub fn resolve(&self, stages: u32) -> Result<CostModel, CostError> {
        let apart = self.host.is_some_and(|h| h.runtime == Runtime::Pytorch);
        if let Some(host) = self.host {
            for (what, v) in host.times() {
                check(what, v)?;
            }
        }
        let per_stage = match &self.stages {
            None => (0..stages)
                .map(|s| {
                    self.default
                        .resolve(&Place::Words(format!("stage {s}")), apart)
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(list) if list.is_empty() => {
                return Err(CostError::StageCount { given: 0, stages })
            }
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(s, c)| {
                    c.or(self.default)
                        .resolve(&Place::Words(format!("stage {s}")), apart)
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let given = per_stage.len();
        CostModel {
            stages: per_stage,
            p2p_latency: 0.0,
            bandwidth: None,
            host: None,
        }
        .resample(stages)
        .map_err(|_| CostError::StageCount { given, stages })?
        .with_link(self.p2p_latency.unwrap_or(0.0), self.bandwidth)
        .map(|model| CostModel {
            host: self.host,
            ..model
        })
    }
}
