//! Sweeps: simulate every (schedule, v, m) combination and compare bubble, throughput and
//! memory, so a user picks the chunk count by looking.

use serde::{Deserialize, Serialize};

use crate::{CapError, MemoryCap};
use pipewright_schedule::cancel::Cancel;
use pipewright_schedule::generators::generate;
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
use pipewright_schedule::timeline::MAX_DEVICES;
use pipewright_schedule::Checked;
use pipewright_sim::simulate::{simulate_steps, Bubbles, CostModel, SimError};

/// One combination's outcome. Combinations that cannot run carry `error` and no figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// Schedule family name.
    pub schedule: String,
    /// Chunks per device.
    pub virtual_stages: u32,
    /// Microbatches.
    pub microbatches: u32,
    /// Step time.
    pub makespan: Option<f64>,
    /// `1 - ideal / makespan`: the single-step bubble.
    pub bubble_fraction: Option<f64>,
    /// Steady-state period: time per step of unfenced steps ([`SWEEP_STEPS`] simulated).
    pub period: Option<f64>,
    /// The bubble against the makespan (`single_step`), the period (`steady_state`) and the
    /// largest per-device span (`largest_span`).
    pub bubble: Option<Bubbles>,
    /// Microbatches per time unit: `m / makespan`.
    pub throughput: Option<f64>,
    /// Most stashed stage-microbatches on any device.
    pub peak_activations: Option<u32>,
    /// Most stashed activation bytes on any device.
    pub peak_activation_bytes: Option<u64>,
    /// Whether the peak fits the memory cap (absent without a cap).
    pub fits: Option<bool>,
    /// Why the combination cannot run.
    pub error: Option<String>,
}

impl SweepRow {
    fn failed(kind: ScheduleKind, v: u32, m: u32, error: String) -> Self {
        SweepRow {
            schedule: kind.name().to_string(),
            virtual_stages: v,
            microbatches: m,
            makespan: None,
            bubble_fraction: None,
            period: None,
            bubble: None,
            throughput: None,
            peak_activations: None,
            peak_activation_bytes: None,
            fits: None,
            error: Some(error),
        }
    }
}

/// One sweep as either face asks for it: the CLI's `sweep` and Python's `sweep(...)` build
/// the same [`SweepRequest`], so what they accept cannot drift apart.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRequest {
    /// Schedule families.
    pub schedules: Vec<ScheduleKind>,
    /// Pipeline devices.
    pub p: u32,
    /// Chunks per device to try.
    pub v: Vec<u32>,
    /// Microbatch counts to try.
    pub m: Vec<u32>,
    /// The memory cap that marks which rows fit, as `search` reads it.
    pub memory_cap: Option<MemoryCap>,
}

/// A sweep request a face cannot run, naming the field; each face renders the field in its
/// own words ([`SweepRequestError::named`]: `--virtual` or `v`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SweepRequestError {
    /// No pipeline device, or more than a timeline holds.
    #[error("p {got}: must be 1 to {MAX_DEVICES} (pipeline devices)")]
    Devices {
        /// What was asked for.
        got: u32,
    },
    /// An empty list of families.
    #[error("schedules names no schedule")]
    NoSchedules,
    /// A count of 0 in `v` or `m`.
    #[error("{field}: counts must be at least 1 (got 0)")]
    ZeroCount {
        /// `v` or `m`.
        field: &'static str,
    },
    /// The cap cannot be turned into bytes at these costs.
    #[error(transparent)]
    Cap(#[from] CapError),
}

impl SweepRequestError {
    /// The message with the field called what `name` calls it (`--virtual` on the command
    /// line).
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        match self {
            SweepRequestError::Devices { got } => {
                format!(
                    "{} {got}: must be 1 to {MAX_DEVICES} (pipeline devices)",
                    name("p")
                )
            }
            SweepRequestError::NoSchedules => format!("{} names no schedule", name("schedules")),
            SweepRequestError::ZeroCount { field } => {
                format!("{}: counts must be at least 1 (got 0)", name(field))
            }
            SweepRequestError::Cap(e) => e.named(name),
        }
    }
}

impl SweepRequest {
    /// Refuse what no sweep can run, naming the field.
    pub fn check(&self) -> Result<(), SweepRequestError> {
        if self.p == 0 || self.p > MAX_DEVICES {
            return Err(SweepRequestError::Devices { got: self.p });
        }
        if self.schedules.is_empty() {
            return Err(SweepRequestError::NoSchedules);
        }
        for (field, counts) in [("v", &self.v), ("m", &self.m)] {
            if counts.contains(&0) {
                return Err(SweepRequestError::ZeroCount { field });
            }
        }
        Ok(())
    }

    /// The checked request as the grid to simulate, its cap in bytes at `costs` (the costs
    /// of `p` stages on `p` devices; needed only with a cap).
    pub fn into_grid(self, costs: Option<&CostModel>) -> Result<SweepGrid, SweepRequestError> {
        self.check()?;
        let memory_cap = match (self.memory_cap, costs) {
            (Some(cap), Some(costs)) => Some(cap.bytes(costs, self.p)?),
            (Some(_), None) => return Err(CapError::NoSizes.into()),
            (None, _) => None,
        };
        Ok(SweepGrid {
            schedules: self.schedules,
            devices: self.p,
            virtual_stages: self.v,
            microbatches: self.m,
            memory_cap,
        })
    }
}

/// Steps simulated back to back for each row's period: a warm-up step, then two whose
/// start-to-start advance is the period (see `search::PERIOD_STEPS`).
pub const SWEEP_STEPS: u32 = 3;

/// What to sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepGrid {
    /// Schedule families.
    pub schedules: Vec<ScheduleKind>,
    /// Devices.
    pub devices: u32,
    /// Chunks per device to try; families without interleaving run once, at v = 1.
    pub virtual_stages: Vec<u32>,
    /// Microbatch counts to try.
    pub microbatches: Vec<u32>,
    /// Largest stashed activation bytes a device may hold.
    pub memory_cap: Option<u64>,
}

/// Simulate every combination of the grid. `costs(stages, devices)` gives the cost model for
/// a timetable of that shape; its error becomes the row's error.
pub fn sweep<F>(grid: &SweepGrid, costs: F) -> Vec<SweepRow>
where
    F: Fn(u32, u32) -> Result<CostModel, String>,
{
    sweep_until(grid, costs, &Cancel::default())
}

/// [`sweep`], stopping before the next combination once `cancel` is set: the rows done so
/// far (the Python face sets it on Ctrl-C).
pub fn sweep_until<F>(grid: &SweepGrid, costs: F, cancel: &Cancel) -> Vec<SweepRow>
where
    F: Fn(u32, u32) -> Result<CostModel, String>,
{
    grid.shapes()
        .into_iter()
        .take_while(|_| !cancel.is_cancelled())
        .map(|(kind, v, m)| {
            run_one(kind, grid.devices, v, m, grid.memory_cap, &costs)
                .unwrap_or_else(|e| SweepRow::failed(kind, v, m, e))
        })
        .collect()
}

impl SweepGrid {
    /// Every (family, v, m) the grid simulates, in order: the grid's `v`s for a family that
    /// interleaves, its own `v` for a V-shaped one, 1 for the others.
    pub fn shapes(&self) -> Vec<(ScheduleKind, u32, u32)> {
        let mut out = Vec::new();
        for &kind in &self.schedules {
            let vs: Vec<u32> = match kind.fixed_virtual() {
                Some(v) => vec![v],
                None if kind.supports_virtual() => self.virtual_stages.clone(),
                None => vec![1],
            };
            for v in vs {
                out.extend(self.microbatches.iter().map(|&m| (kind, v, m)));
            }
        }
        out
    }

    /// Each combination's stage-microbatches (p * v * m), in [`shapes`](Self::shapes)' order:
    /// what a simulation of it holds and walks.
    pub fn stage_microbatches(&self) -> Vec<u64> {
        let spm = |(_, v, m): (ScheduleKind, u32, u32)| {
            u64::from(self.devices) * u64::from(v) * u64::from(m)
        };
        self.shapes().into_iter().map(spm).collect()
    }
}

fn run_one<F>(
    kind: ScheduleKind,
    p: u32,
    v: u32,
    m: u32,
    cap: Option<u64>,
    costs: &F,
) -> Result<SweepRow, String>
where
    F: Fn(u32, u32) -> Result<CostModel, String>,
{
    let spec = ScheduleSpec::new(kind, p, v, m, None).map_err(|e| e.to_string())?;
    let model = costs(spec.stages(), p)?;
    let tt = Checked::new(generate(&spec)).map_err(|e| SimError::from(e).to_string())?;
    let steady = simulate_steps(&tt, &model, SWEEP_STEPS).map_err(|e| e.to_string())?;
    let report = steady.single.report;
    if report.makespan <= 0.0 {
        // Throughput and bubble over no time are undefined, not 0.
        return Err("the step takes no time (every cost is 0): throughput and bubble are undefined; give costs above 0".into());
    }
    let peak_bytes = report.peak_activation_bytes();
    Ok(SweepRow {
        schedule: kind.name().to_string(),
        virtual_stages: v,
        microbatches: m,
        makespan: Some(report.makespan),
        bubble_fraction: Some(report.bubble_fraction),
        period: Some(steady.report.period),
        bubble: Some(steady.report.bubble),
        throughput: Some(f64::from(m) / report.makespan),
        peak_activations: Some(report.peak_activations()),
        peak_activation_bytes: Some(peak_bytes),
        fits: cap.map(|c| peak_bytes <= c),
        error: None,
    })
}

/// The row with the highest throughput among those that ran and fit the cap (if any);
/// ties go to less memory, then to the row listed first (the simpler schedule).
pub fn best(rows: &[SweepRow]) -> Option<&SweepRow> {
    rows.iter()
        .rev()
        .filter(|r| r.error.is_none() && r.fits != Some(false))
        .max_by(|a, b| {
            let ta = a.throughput.unwrap_or(0.0);
            let tb = b.throughput.unwrap_or(0.0);
            ta.total_cmp(&tb)
                .then(b.peak_activation_bytes.cmp(&a.peak_activation_bytes))
        })
}

/// Why a list of counts cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: {why} (expected a list like 4,8,16 or a range like 4..64:x2, 1..8 or 2..32:+2)")]
pub struct CountsError {
    /// The text given.
    pub text: String,
    /// What is wrong.
    pub why: String,
}

/// Read counts: a comma-separated list of numbers and ranges. `a..b` counts `a` to `b`
/// inclusive by one, `a..b:+k` by `k`, `a..b:xk` multiplying by `k`.
pub fn parse_counts(text: &str) -> Result<Vec<u32>, CountsError> {
    let err = |why: &str| CountsError {
        text: text.to_string(),
        why: why.to_string(),
    };
    let num = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| err(&format!("`{}` is not a whole number", s.trim())))
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((a, rest)) = part.split_once("..") else {
            out.push(num(part)?);
            continue;
        };
        let (b, step) = rest.split_once(':').unwrap_or((rest, "+1"));
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(err(&format!("range {a}..{b} runs backwards")));
        }
        let (geometric, k) = match step.trim().split_at_checked(1) {
            Some(("x", k)) => (true, num(k)?),
            Some(("+", k)) => (false, num(k)?),
            _ => return Err(err(&format!("step `{step}` must be +k or xk"))),
        };
        if (geometric && (k < 2 || a == 0)) || k == 0 {
            return Err(err(
                "a step must make progress (+1 or more, x2 or more from a start above 0)",
            ));
        }
        let mut x = u64::from(a);
        while x <= u64::from(b) {
            out.push(x as u32);
            x = if geometric {
                x * u64::from(k)
            } else {
                x + u64::from(k)
            };
            if out.len() > 100_000 {
                return Err(err("more than 100000 values"));
            }
        }
    }
    if out.is_empty() {
        return Err(err("no values"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What makes a good request bad.
    type Spoil<R> = fn(&mut R);
    use pipewright_sim::simulate::StageCost;

    #[test]
    fn counts_lists_and_ranges() {
        assert_eq!(parse_counts("4,8,16").unwrap(), [4, 8, 16]);
        assert_eq!(parse_counts("4..64:x2").unwrap(), [4, 8, 16, 32, 64]);
        assert_eq!(parse_counts("1..4, 10").unwrap(), [1, 2, 3, 4, 10]);
        assert_eq!(parse_counts("2..9:+3").unwrap(), [2, 5, 8]);
        for bad in ["", "4..2", "a", "1..8:x1", "1..8:*2", "0..8:x2", "1..8:+0"] {
            assert!(parse_counts(bad).is_err(), "{bad}");
        }
    }

    fn uniform(stages: u32, devices: u32) -> Result<CostModel, String> {
        let mut c = StageCost::new(1.0, 2.0, None).map_err(|e| e.to_string())?;
        c.activation_bytes = 100;
        Ok(CostModel::uniform(stages, c.split(stages / devices)))
    }

    #[test]
    fn one_f_one_b_bubble_falls_with_m_and_matches_the_closed_form() {
        let grid = SweepGrid {
            schedules: vec![ScheduleKind::OneFOneB],
            devices: 4,
            virtual_stages: vec![1],
            microbatches: parse_counts("1..64:x2").unwrap(),
            memory_cap: None,
        };
        let rows = sweep(&grid, uniform);
        let bubbles: Vec<f64> = rows.iter().map(|r| r.bubble_fraction.unwrap()).collect();
        for (r, b) in rows.iter().zip(&bubbles) {
            let m = f64::from(r.microbatches);
            assert!((b - 3.0 / (m + 3.0)).abs() < 1e-12);
        }
        assert!(bubbles.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn unrunnable_combinations_are_listed_and_the_cap_picks_the_best_fit() {
        let grid = SweepGrid {
            schedules: vec![ScheduleKind::GPipe, ScheduleKind::Interleaved1F1B],
            devices: 4,
            virtual_stages: vec![1, 2],
            microbatches: vec![2, 8, 32],
            memory_cap: Some(800),
        };
        let rows = sweep(&grid, uniform);
        assert_eq!(
            rows.len(),
            3 + 6,
            "gpipe once at v=1, interleaved at v=1 and v=2"
        );
        let few = rows
            .iter()
            .find(|r| r.virtual_stages == 2 && r.microbatches == 2)
            .unwrap();
        assert!(few
            .error
            .as_deref()
            .unwrap()
            .contains("needs at least p=4 microbatches"));
        // GPipe stashes m microbatches (100 bytes each): 32 breaks the cap of 800.
        let big = rows
            .iter()
            .find(|r| r.schedule == "gpipe" && r.virtual_stages == 1 && r.microbatches == 32)
            .unwrap();
        assert_eq!(big.fits, Some(false));
        let b = best(&rows).unwrap();
        assert_eq!(
            (b.schedule.as_str(), b.virtual_stages, b.microbatches),
            ("interleaved-1f1b", 2, 32)
        );
        assert!(b.peak_activation_bytes.unwrap() <= 800);
    }

    #[test]
    fn a_bad_request_is_refused_naming_the_field_in_each_face_s_words() {
        let request = SweepRequest {
            schedules: vec![ScheduleKind::OneFOneB],
            p: 2,
            v: vec![1, 2],
            m: vec![4, 8],
            memory_cap: None,
        };
        let flag = |f: &str| match f {
            "p" => "--stages".to_string(),
            "v" => "--virtual".to_string(),
            "m" => "--microbatches".to_string(),
            f => format!("--{f}"),
        };
        let cases: [(Spoil<SweepRequest>, &str, &str); 4] = [
            (
                |r| r.p = 0,
                "--stages 0: must be 1 to 65536 (pipeline devices)",
                "p 0: must be 1",
            ),
            (
                |r| r.schedules.clear(),
                "--schedules names no schedule",
                "schedules names",
            ),
            (
                |r| r.v.push(0),
                "--virtual: counts must be at least 1 (got 0)",
                "v: counts",
            ),
            (
                |r| r.m[0] = 0,
                "--microbatches: counts must be at least 1 (got 0)",
                "m: counts",
            ),
        ];
        for (spoil, cli, python) in cases {
            let mut r = request.clone();
            spoil(&mut r);
            let e = r.into_grid(None).unwrap_err();
            assert_eq!(e.named(flag), cli);
            assert!(e.named(str::to_string).starts_with(python), "{e}");
        }
        let capped = SweepRequest {
            memory_cap: Some(MemoryCap::Microbatches(2.0)),
            ..request.clone()
        };
        let costs = CostModel::uniform(
            2,
            pipewright_sim::simulate::StageCost::new(1.0, 2.0, None).unwrap(),
        );
        assert_eq!(
            capped.into_grid(Some(&costs)).unwrap_err(),
            CapError::NoSizes.into()
        );
        let grid = request.into_grid(None).unwrap();
        assert_eq!((grid.devices, grid.memory_cap), (2, None));
    }
}
