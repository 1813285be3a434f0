//! Memory in the search's unit: one microbatch's activations of one device's share of the
//! model (`1/p` of it). A 1F1B device 0 peaks at `p` such units, GPipe at `m`; a chunk of an
//! interleaved or V schedule weighs `1/v` of a unit (or its share of the activation bytes).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use pipewright_model::memory::{peak_walk, StageBytes};
use pipewright_model::shape::request::flag_form;
use pipewright_schedule::timetable::Timetable;
use pipewright_sim::simulate::CostModel;

/// A per-device memory cap for stashed activations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryCap {
    /// In units of one microbatch's activations of one device's share of the model.
    Microbatches(f64),
    /// In bytes (needs activation bytes in the costs).
    Bytes(u64),
}

/// Why a cap could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    /// Neither a number of microbatches nor bytes with a known unit.
    #[error("memory cap `{0}`: expected a number of microbatches (e.g. 8 or 2.5) or bytes with a unit (e.g. 512MiB, 24GB, 4096B; units B, kB, MB, GB, KiB, MiB, GiB, TiB)")]
    Unreadable(String),
    /// A cap in microbatches turned into bytes for costs that carry no activation sizes
    /// (the fields `memory_cap`, `activation_bytes`, `cost_file`; see [`CapError::named`]).
    #[error("{}", self.named(|f| flag_form(f, None)))]
    NoSizes,
    /// Zero or negative: no schedule can run without stashing an activation.
    #[error("memory cap `{0}`: a device must stash at least some activations to run any schedule; give a positive cap, e.g. 1 (one microbatch, the least 1F1B's last device needs) or 512MiB")]
    NotPositive(String),
}

impl CapError {
    /// The message with each field written as `name` writes it (`--memory-cap` on the
    /// command line); `Display` is the command line's.
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        match self {
            CapError::NoSizes => format!(
                "{} needs activation sizes: give {} or a {} with activation_bytes",
                name("memory_cap"),
                name("activation_bytes"),
                name("cost_file")
            ),
            e => e.to_string(),
        }
    }
}

impl FromStr for MemoryCap {
    type Err = CapError;

    fn from_str(text: &str) -> Result<Self, CapError> {
        let t = text.trim();
        let bad = || CapError::Unreadable(text.to_string());
        let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num.trim().parse().map_err(|_| bad())?;
        if !value.is_finite() {
            return Err(bad());
        }
        if value <= 0.0 {
            return Err(CapError::NotPositive(text.to_string()));
        }
        if unit.trim().is_empty() {
            return Ok(MemoryCap::Microbatches(value));
        }
        let scale = unit_scale(unit).ok_or_else(bad)?;
        let bytes = (value * scale).round();
        if bytes < 1.0 {
            return Err(CapError::NotPositive(text.to_string()));
        }
        if bytes >= u64::MAX as f64 {
            return Err(bad());
        }
        Ok(MemoryCap::Bytes(bytes as u64))
    }
}

/// Bytes in one of `unit` (`B`, `kB`, `MB`, `GB`, `KiB`, `MiB`, `GiB`, `TiB`, any case;
/// empty is bytes): the one unit table of every byte count pipewright reads.
fn unit_scale(unit: &str) -> Option<f64> {
    Some(match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => return None,
    })
}

/// A byte count that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a byte count: give a whole number of bytes (4096) or a number with a unit (1MiB, 2.5GB; units B, kB, MB, GB, KiB, MiB, GiB, TiB)")]
pub struct BytesError(pub String);

/// A byte count: a number of bytes, or a number with a unit (`1MiB`, `2.5GB`), the same
/// units as a memory cap in bytes; 0 is a count too.
pub fn parse_bytes(text: &str) -> Result<u64, BytesError> {
    let t = text.trim();
    let bad = || BytesError(text.to_string());
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if unit.trim().is_empty() {
        // Plain bytes: read exactly, every u64 included.
        return num.trim().parse().map_err(|_| bad());
    }
    let value: f64 = num.trim().parse().map_err(|_| bad())?;
    let bytes = (value * unit_scale(unit).ok_or_else(bad)?).round();
    if !(value.is_finite() && value >= 0.0 && bytes < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

impl MemoryCap {
    /// The cap in bytes for `costs` on `devices` (what `sweep` marks rows by): a cap in
    /// microbatches is that many of one microbatch's activation bytes of one device's share,
    /// so the costs must carry activation sizes.
    pub fn bytes(self, costs: &CostModel, devices: u32) -> Result<u64, CapError> {
        let Some(unit) = unit_bytes(costs, devices) else {
            return Err(CapError::NoSizes);
        };
        Ok(match self {
            MemoryCap::Bytes(b) => b,
            MemoryCap::Microbatches(x) => (x * unit).round() as u64,
        })
    }
}

impl fmt::Display for MemoryCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryCap::Microbatches(x) => write!(f, "{x} microbatches"),
            MemoryCap::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

/// Bytes of one unit for a cost model: the model's activation bytes per microbatch over `p`
/// devices; `None` when the costs carry no activation sizes.
pub fn unit_bytes(costs: &CostModel, devices: u32) -> Option<f64> {
    // In floating point: sizes near 2^64 each must not wrap their sum.
    let total: f64 = costs.stages.iter().map(|c| c.activation_bytes as f64).sum();
    (total > 0.0 && devices > 0).then(|| total / f64::from(devices))
}

/// Weight of each stage in units: its share of the activation bytes, or `p / S` when the
/// costs carry no sizes (every chunk an equal slice of the model).
pub fn stage_weights(costs: &CostModel, devices: u32) -> Vec<f64> {
    let n = costs.stages.len();
    match unit_bytes(costs, devices) {
        Some(unit) => costs
            .stages
            .iter()
            .map(|c| c.activation_bytes as f64 / unit)
            .collect(),
        None => vec![f64::from(devices) / n.max(1) as f64; n],
    }
}

/// Units each stage still holds after its input backward (I) until its W: its weight times
/// its `w_memory` fraction (the whole weight by default).
pub fn held_weights(costs: &CostModel, weights: &[f64]) -> Vec<f64> {
    weights
        .iter()
        .enumerate()
        .map(|(s, &w)| {
            let fraction = costs.stages.get(s).map_or(1.0, |c| c.w_memory);
            if fraction >= 1.0 {
                w
            } else {
                w * fraction
            }
        })
        .collect()
}

/// Most units each device holds at once when it runs its actions in order, a pending W
/// holding its stage's whole weight. See [`peak_units_held`].
pub fn peak_units(tt: &Timetable, weights: &[f64]) -> Vec<f64> {
    peak_units_held(tt, weights, weights)
}

/// Units each stage keeps of a microbatch that an `R` recomputes, from its F until that R:
/// its weight times [`CostModel::kept_bytes`] over its activation bytes (its input's share),
/// and nothing when the costs carry no sizes.
pub fn kept_weights(costs: &CostModel, weights: &[f64]) -> Vec<f64> {
    weights
        .iter()
        .enumerate()
        .map(|(s, &w)| {
            let all = costs.stages.get(s).map_or(0, |c| c.activation_bytes);
            if all == 0 {
                return 0.0;
            }
            let kept = costs.kept_bytes(s as u32).min(all);
            w * kept as f64 / all as f64
        })
        .collect()
}

/// Most units each device holds at once when it runs its actions in order. A device runs one
/// action at a time, so this is the timed peak too: F stashes its stage's weight at its start,
/// B frees it at its end; a split backward's I frees all but `held` (what W still needs) at
/// its end and W frees the rest at its end; an F&B overlap holds both at once. `R` actions
/// change nothing here (see [`peak_units_kept`] for recomputation).
pub fn peak_units_held(tt: &Timetable, weights: &[f64], held: &[f64]) -> Vec<f64> {
    peak_units_kept(tt, weights, held, weights)
}

/// [`peak_units_held`] with recomputation: a microbatch with an `R` keeps only `kept` of its
/// stage from its F until the R, which regrows the rest (the search sets no policy, so the
/// other microbatches keep everything).
pub fn peak_units_kept(tt: &Timetable, weights: &[f64], held: &[f64], kept: &[f64]) -> Vec<f64> {
    let named = pipewright_schedule::recompute::recomputed(tt);
    peak_walk(tt, &unit_stages(&named, weights, held, kept))
}

/// The walk's per-stage sizes in units: `kept` only for the `named` stages, those with an
/// `R` (without a policy, a stage without `R`s keeps everything).
pub(super) fn unit_stages(
    named: &std::collections::BTreeSet<u32>,
    weights: &[f64],
    held: &[f64],
    kept: &[f64],
) -> Vec<StageBytes> {
    let at = |v: &[f64], s: usize| v.get(s).copied().unwrap_or(0.0);
    (0..weights.len())
        .map(|s| {
            let full = at(weights, s);
            let mut b = StageBytes::plain(full, at(held, s));
            if named.contains(&(s as u32)) {
                b.kept = at(kept, s).min(full);
            }
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
    use pipewright_schedule::Checked;
    use pipewright_sim::simulate::{simulate, StageCost};

    /// Per-device peaks of a family on `p` devices, `m` microbatches, one unit per stage and
    /// `r` of it held after I until W, counted in units and by the simulator in bytes.
    fn peaks(kind: ScheduleKind, p: u32, m: u32, r: f64) -> (Vec<f64>, Vec<f64>) {
        let tt = Checked::new(pipewright_schedule::generate(
            &ScheduleSpec::new(kind, p, 1, m, None).unwrap(),
        ))
        .unwrap();
        let mut c = StageCost::new(1.0, 2.0, Some(1.0)).unwrap();
        c.activation_bytes = 1000;
        c.w_memory = r;
        let costs = CostModel::uniform(p, c);
        let weights = stage_weights(&costs, p);
        let units = peak_units_held(&tt, &weights, &held_weights(&costs, &weights));
        let sim = simulate(&tt, &costs).unwrap();
        let bytes = sim.report.devices.iter();
        (
            units,
            bytes
                .map(|d| d.peak_activation_bytes as f64 / 1000.0)
                .collect(),
        )
    }

    #[test]
    fn zb_peaks_with_the_split_follow_the_papers_closed_forms() {
        // Qi et al., section 2.3: worker i (from 1) peaks at (p-i+1) M_B + (i-1) M_W under
        // ZB-H1 and (2p-2i+1) M_B + (2i-2) M_W under ZB-H2.
        let (p, m, r) = (6, 18, 0.375);
        type ClosedForm = fn(f64) -> f64;
        let cases: [(ScheduleKind, ClosedForm); 2] = [
            (ScheduleKind::ZbH1, |i| (6.0 - i + 1.0) + (i - 1.0) * 0.375),
            (ScheduleKind::ZbH2, |i| {
                (12.0 - 2.0 * i + 1.0) + (2.0 * i - 2.0) * 0.375
            }),
        ];
        for (kind, closed) in cases {
            let (units, bytes) = peaks(kind, p, m, r);
            for d in 0..p as usize {
                let want = closed(d as f64 + 1.0);
                assert!((units[d] - want).abs() < 1e-9, "{kind:?} {d}: {units:?}");
                assert!((bytes[d] - want).abs() < 1e-9, "{kind:?} {d}: {bytes:?}");
            }
        }
        // The default (W holds it all) is today's count: 1F1B-like p and 2p-1 on device 0.
        let (units, bytes) = peaks(ScheduleKind::ZbH2, p, m, 1.0);
        assert_eq!(units, bytes);
        assert_eq!(units[0], 11.0);
        assert_eq!(
            units,
            peak_units(
                &pipewright_schedule::generate(
                    &ScheduleSpec::new(ScheduleKind::ZbH2, p, 1, m, None).unwrap()
                ),
                &[1.0; 6]
            )
        );
    }

    #[test]
    fn caps_parse_as_microbatches_or_bytes() {
        assert_eq!("8".parse(), Ok(MemoryCap::Microbatches(8.0)));
        assert_eq!("2.5".parse(), Ok(MemoryCap::Microbatches(2.5)));
        assert_eq!("512MiB".parse(), Ok(MemoryCap::Bytes(512 << 20)));
        assert_eq!("24GB".parse(), Ok(MemoryCap::Bytes(24_000_000_000)));
        assert_eq!("4096 B".parse(), Ok(MemoryCap::Bytes(4096)));
        for bad in ["", "x", "3 parsecs", "nan", "inf", "1e30TiB"] {
            assert_eq!(
                bad.parse::<MemoryCap>(),
                Err(CapError::Unreadable(bad.into())),
                "{bad}"
            );
        }
        for zero in ["-1", "0", "0GiB", "0.1B"] {
            let err = zero.parse::<MemoryCap>().unwrap_err();
            assert_eq!(err, CapError::NotPositive(zero.into()));
            assert!(
                err.to_string().contains("at least some activations"),
                "{err}"
            );
        }
    }
}
