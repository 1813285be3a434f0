//! `plan --validate K`: run K of the plan's simulated configurations on this machine
//! (in-process devices, the reference GPT, through `pipewright train` itself) and compare the
//! measured steady-state period with the predicted step time, with their rank correlation.
//!
//! The K are the best, the slowest simulated, and others spread by predicted time between
//! them, not the top K: the top few are often within a percent of each other, where ranks say
//! nothing but the machine's noise.

use anyhow::{anyhow, bail, Context, Result};
use pipewright::runtime::{gpt_config, StepReport};

use super::memory::human;
use pipewright::schedule::memory::{MemoryBreakdown, ModelShape};
use pipewright::schedule::plan::fit::peaks_as_run;
use pipewright::schedule::plan::launch::{family_flags, train_flags};
use pipewright::schedule::plan::rank::spearman;
use pipewright::schedule::plan::{Config, PlanRequest};

/// Steps each configuration trains for (the period is the median advance after the first).
const STEPS: &str = "6";

/// `train`'s arguments for `c` on in-process devices: the plan's own launch flags (the
/// library builds both), printing one step report per line.
fn train_args(req: &PlanRequest, s: &ModelShape, c: &Config) -> Vec<String> {
    let flags = train_flags(req, s, c, &family_flags(c));
    [
        "train",
        "--transport",
        "local",
        "--format",
        "json",
        "--log-interval",
        "0",
        "--steps",
        STEPS,
    ]
    .into_iter()
    .chain(flags.split_whitespace())
    .map(str::to_string)
    .collect()
}

/// The measured steady-state period of one training run, in seconds, and each pipeline
/// device's fullest rank's measured peak in bytes.
fn measure(req: &PlanRequest, shape: &ModelShape, c: &Config) -> Result<(f64, Vec<u64>)> {
    let out = super::self_command::command()?
        .args(train_args(req, shape, c))
        .output()
        .context("running `train`")?;
    if !out.status.success() {
        bail!("train of {c} failed: {}", child_failure(&out));
    }
    read_report(c, &String::from_utf8_lossy(&out.stdout))
}

/// The period and per-device peaks of `train`'s last step report in `text` (its stdout).
fn read_report(c: &Config, text: &str) -> Result<(f64, Vec<u64>)> {
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("train of {c} printed no step"))?;
    let report = StepReport::from_line(last).with_context(|| format!("train of {c}"))?;
    let period = report
        .steady_state_period_ms
        .map(|ms| ms / 1e3)
        .ok_or_else(|| anyhow!("train of {c} reported no period"))?;
    Ok((period, report.device_peak_totals((c.tp * c.dp) as usize)))
}

/// Why a child `train` failed: its `error:` line, or how it ended (a signal: killed, most
/// often by the kernel for memory), never an unrelated note.
fn child_failure(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    if let Some(line) = err.lines().find_map(|l| l.strip_prefix("error: ")) {
        return line.to_string();
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = out.status.signal() {
            let why = if sig == 9 {
                " (most often the kernel, out of memory)"
            } else {
                ""
            };
            return format!("killed by signal {sig}{why}");
        }
    }
    format!("{}, with no error line", out.status)
}

/// Bytes an in-process run of `c` holds: each pipeline device's predicted peak for every
/// one of its `tp x dp` ranks (with half again for what the model leaves out).
fn in_process_bytes(req: &PlanRequest, c: &Config) -> Result<u64> {
    let peaks = peaks_as_run(req, c).map_err(|e| anyhow!("{e}"))?;
    let ranks = u64::from(c.tp) * u64::from(c.dp);
    let all = peaks
        .iter()
        .map(|m| m.total().saturating_mul(ranks))
        .fold(0u64, u64::saturating_add);
    Ok(all.saturating_add(all / 2))
}

/// The configurations an in-process run of which fits this machine's memory; refused in one
/// line with the figures when fewer than 2 do.
pub fn fitting(req: &PlanRequest, simulated: &[(Config, f64)]) -> Result<Vec<(Config, f64)>> {
    // What cannot be trained at all is refused first, before what does not fit.
    trainable(req)?;
    let have = super::budget::machine_memory();
    let mut smallest: Option<u64> = None;
    let mut out = Vec::new();
    for (c, t) in simulated {
        let need = in_process_bytes(req, c)?;
        smallest = Some(smallest.map_or(need, |s| s.min(need)));
        if need <= have {
            out.push((*c, *t));
        }
    }
    if out.len() < 2 {
        bail!(
            "--validate trains configurations in-process here, and {} of the {} simulated fit this machine's {} (the smallest needs {}): plan a smaller model, or calibrate a cluster of this machine (--calibrate)",
            out.len(),
            simulated.len(),
            human(have),
            human(smallest.unwrap_or(0))
        );
    }
    Ok(out)
}

/// Largest relative error of the predicted per-device peaks against the measured ones
/// (`None` when `train` reported no memory or the device counts differ).
fn memory_error(predicted: &[MemoryBreakdown], measured: &[u64]) -> Option<f64> {
    if measured.is_empty() || predicted.len() != measured.len() {
        return None;
    }
    predicted
        .iter()
        .zip(measured)
        .map(|(p, &m)| (p.total() as f64 - m as f64).abs() / (m.max(1) as f64))
        .reduce(f64::max)
}

/// `k` of `simulated` (fastest first): the first, the last, and between them those nearest
/// to predicted times spaced evenly on a log scale. Spacing by time rather than by rank keeps
/// the picks apart where many configurations predict nearly the same time, so that their
/// order is a claim of the model and not a draw of this machine's noise.
pub fn spread(simulated: &[(Config, f64)], k: usize) -> Vec<(Config, f64)> {
    let n = simulated.len();
    if n <= k {
        return simulated.to_vec();
    }
    let (lo, hi) = (simulated[0].1.max(1e-12), simulated[n - 1].1.max(1e-12));
    let mut picked = vec![false; n];
    picked[0] = true;
    picked[n - 1] = true;
    for i in 1..k.saturating_sub(1) {
        let target = lo * (hi / lo).powf(i as f64 / (k - 1) as f64);
        let nearest = (0..n).filter(|&j| !picked[j]).min_by(|&a, &b| {
            let d = |j: usize| (simulated[j].1.max(1e-12) / target).ln().abs();
            d(a).total_cmp(&d(b))
        });
        if let Some(j) = nearest {
            picked[j] = true;
        }
    }
    (0..n)
        .filter(|&j| picked[j])
        .map(|j| simulated[j])
        .collect()
}

/// The planned shape, when the reference GPT can train it (every kind but tied embeddings).
fn trainable(req: &PlanRequest) -> Result<&ModelShape> {
    let Some(shape) = req.model.gpt() else {
        bail!("--validate trains the reference GPT; a --profile's model is the user's own program");
    };
    gpt_config(shape).map_err(|e| anyhow!("--validate trains the planned shape: {e}"))?;
    if req.fp8 {
        bail!("--validate trains in bf16 on this machine, so it cannot check --fp8's times: leave out one of them");
    }
    Ok(shape)
}

/// Run every configuration, print predicted against measured and their rank correlation.
pub fn validate(req: &PlanRequest, runs: &[(Config, f64)]) -> Result<String> {
    let shape = trainable(req)?;
    let mut out = format!(
        "\nvalidation: {} configurations (the best, the slowest simulated, and between them spread by predicted time) trained in-process for {STEPS} steps each, twice (the faster period counts)\n  #  predicted s  measured s  measured/predicted  peak memory error  configuration\n",
        runs.len()
    );
    let (mut predicted, mut measured) = (Vec::new(), Vec::new());
    let mut worst_memory: Option<f64> = None;
    // Every configuration twice, in two passes, keeping the faster period: the machine's load
    // only ever slows a run down, and a second pass minutes later rarely meets the same load.
    let mut first = Vec::with_capacity(runs.len());
    for (c, _) in runs {
        first.push(measure(req, shape, c)?);
    }
    for (i, (c, p)) in runs.iter().enumerate() {
        let (again, _) = measure(req, shape, c)?;
        let (m, peaks) = (first[i].0.min(again), &first[i].1);
        let err = memory_error(&peaks_as_run(req, c).map_err(|e| anyhow!("{e}"))?, peaks);
        if let Some(e) = err {
            worst_memory = Some(worst_memory.map_or(e, |w: f64| w.max(e)));
        }
        out += &format!(
            "{:>3}  {:>11.4}  {:>10.4}  {:>18.2}  {:>17}  {c}\n",
            i + 1,
            p,
            m,
            m / p,
            err.map_or("-".to_string(), |e| format!("{:.1}%", 100.0 * e)),
        );
        predicted.push(*p);
        measured.push(m);
    }
    if let Some(w) = worst_memory {
        out += &format!(
            "largest error of a device's predicted peak memory against its fullest rank's measured peak: {:.1}%\n",
            100.0 * w
        );
    }
    out += &match spearman(&predicted, &measured) {
        Some(rho) => format!("Spearman rank correlation, predicted against measured: {rho:.2}\n"),
        None => "Spearman rank correlation: undefined (fewer than 2 distinct values)\n".into(),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright::runtime::RankMemory;
    use pipewright::schedule::{Recompute, ScheduleKind};

    fn config() -> Config {
        Config {
            tp: 1,
            pp: 2,
            dp: 2,
            v: 1,
            microbatch_size: 1,
            microbatches: 4,
            schedule: ScheduleKind::OneFOneB,
            recompute: Recompute::None,
            recompute_devices: 2,
            zero: 0,
            sequence_parallel: false,
            ep: 1,
            etp: 1,
        }
    }

    fn request(shape: &ModelShape) -> PlanRequest {
        let cluster = pipewright::schedule::plan::cluster::a100_80g();
        PlanRequest::new(*shape, cluster, 4, 8)
    }

    /// `train`'s stdout: a note, then one step report whose memory is `peaks` (by rank).
    fn stdout(peaks: &[u64], period: serde_json::Value) -> String {
        let rank = |p| RankMemory {
            peak: MemoryBreakdown {
                parameters: p,
                ..MemoryBreakdown::default()
            },
            ..RankMemory::default()
        };
        let mut v = serde_json::json!({"step": 5, "loss": 1.5, "tokens_per_second": 10.0,
            "seconds": 0.1, "bubble_fraction": 0.2, "peak_stash": [1, 1], "peak_stash_bytes": [1, 1],
            "kept_per_microbatch": [1, 1], "optimizer_state_bytes": [0, 0, 0, 0],
            "oversubscribed": false});
        v["memory"] =
            serde_json::to_value(peaks.iter().map(|&p| rank(p)).collect::<Vec<_>>()).unwrap();
        v["steady_state_period_ms"] = period;
        format!("training\n{v}\n")
    }

    #[test]
    fn training_runs_take_the_launch_line_s_flags_on_local_ranks() {
        let shape = ModelShape::gpt(2, 64, 4, 256, 16, 128);
        let c = Config {
            sequence_parallel: true,
            ..config()
        };
        let args = train_args(&request(&shape), &shape, &c).join(" ");
        assert_eq!(
            args,
            "train --transport local --format json --log-interval 0 --steps 6 --precision bf16 --schedule 1f1b --stages 2 --virtual 1 --microbatches 4 --microbatch-size 1 --tp 1 --dp 2 --zero 0 --recompute none --sequence-parallel --layers 2 --d-model 64 --heads 4 --seq-len 16 --vocab 128"
        );
    }

    #[test]
    fn a_report_gives_the_period_and_each_device_s_fullest_rank() {
        let (period, peaks) = read_report(&config(), &stdout(&[5, 9, 4, 3], 250.0.into())).unwrap();
        assert_eq!((period, peaks), (0.25, vec![9, 4]));
    }

    #[test]
    fn a_malformed_report_is_refused_in_one_line_naming_the_field() {
        let c = config();
        let e = read_report(&c, &stdout(&[5, 9, 4, 3], "fast".into())).unwrap_err();
        let line = super::super::console::one_line(&e);
        assert!(
            line.starts_with(&format!(
                "train of {c}: step report field `steady_state_period_ms`: invalid type: string \"fast\""
            )),
            "{line}"
        );
        let e = read_report(&c, &stdout(&[5, 9, 4, 3], serde_json::Value::Null)).unwrap_err();
        assert_eq!(e.to_string(), format!("train of {c} reported no period"));
        let e = read_report(&c, "no step here\n").unwrap_err();
        assert_eq!(e.to_string(), format!("train of {c} printed no step"));
    }
}
