//! `plan --validate K`: run K of the plan's simulated configurations on this machine
//! (in-process devices, the reference GPT, through `pipewright train` itself) and compare the
//! measured steady-state period with the predicted step time, with their rank correlation.
//!
//! The K are the best and others spread evenly down the ranking of everything simulated, not
//! the top K: the top few are often within a percent of each other, where ranks say nothing
//! but the machine's noise.

use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use pipewright::schedule::plan::rank::spearman;
use pipewright::schedule::plan::{Config, PlanRequest};

/// Steps each configuration trains for (the period is the median advance after the first).
const STEPS: &str = "6";

/// `train`'s arguments for `row` on in-process devices.
fn train_args(req: &PlanRequest, c: &Config) -> Vec<String> {
    let s = &req.shape;
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
    .iter()
    .map(|x| x.to_string())
    .chain(
        [
            ("--precision", req.precision.name().to_string()),
            ("--schedule", c.schedule.to_string()),
            ("--stages", c.pp.to_string()),
            ("--virtual", c.v.to_string()),
            ("--microbatches", c.microbatches.to_string()),
            ("--microbatch-size", c.microbatch_size.to_string()),
            ("--tp", c.tp.to_string()),
            ("--dp", c.dp.to_string()),
            ("--zero", c.zero.to_string()),
            ("--recompute", c.recompute.to_string()),
            ("--layers", s.layers.to_string()),
            ("--d-model", s.d_model.to_string()),
            ("--heads", s.heads.to_string()),
            ("--seq-len", s.seq_len.to_string()),
            ("--vocab", s.vocab.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v]),
    )
    .collect()
}

/// The measured steady-state period of one training run, in seconds.
fn measure(req: &PlanRequest, c: &Config) -> Result<f64> {
    let exe = std::env::current_exe().context("finding this program to run `train`")?;
    let out = Command::new(exe)
        .args(train_args(req, c))
        .output()
        .context("running `train`")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "train of {} failed: {}",
            c,
            err.lines().last().unwrap_or("")
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("train of {} printed no step", c))?;
    let v: serde_json::Value = serde_json::from_str(last)?;
    v["steady_state_period_ms"]
        .as_f64()
        .map(|ms| ms / 1e3)
        .ok_or_else(|| anyhow!("train of {} reported no period", c))
}

/// `k` of `simulated` (fastest first): the first, the last, and evenly between.
pub fn spread(simulated: &[(Config, f64)], k: usize) -> Vec<(Config, f64)> {
    let n = simulated.len();
    if n <= k {
        return simulated.to_vec();
    }
    let mut picks: Vec<usize> = (0..k).map(|i| i * (n - 1) / (k - 1).max(1)).collect();
    picks.dedup();
    picks.into_iter().map(|i| simulated[i]).collect()
}

/// Run every configuration, print predicted against measured and their rank correlation.
pub fn validate(req: &PlanRequest, runs: &[(Config, f64)]) -> Result<String> {
    if req.shape.ffn != 4 * req.shape.d_model {
        bail!("--validate runs the reference GPT, whose ffn is 4 * d_model: leave --ffn out");
    }
    let mut out = format!(
        "\nvalidation: {} configurations (the best, then spread down the ranking) trained in-process for {STEPS} steps each\n  #  predicted s  measured s  measured/predicted  configuration\n",
        runs.len()
    );
    let (mut predicted, mut measured) = (Vec::new(), Vec::new());
    for (i, (c, p)) in runs.iter().enumerate() {
        let m = measure(req, c)?;
        out += &format!(
            "{:>3}  {:>11.4}  {:>10.4}  {:>18.2}  {c}\n",
            i + 1,
            p,
            m,
            m / p,
        );
        predicted.push(*p);
        measured.push(m);
    }
    out += &match spearman(&predicted, &measured) {
        Some(rho) => format!("Spearman rank correlation, predicted against measured: {rho:.2}\n"),
        None => "Spearman rank correlation: undefined (fewer than 2 distinct values)\n".into(),
    };
    Ok(out)
}
