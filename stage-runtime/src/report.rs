//! [`StepReport`]: one training step as `pipewright train --format json` prints it (one JSON
//! object per line) and as `plan --validate` reads it back. One type for the writer and the
//! reader, so the schema cannot drift between them; a line that does not match is refused
//! naming the field.

use serde::{Deserialize, Serialize};

use crate::memory::RankMemory;
use crate::run::StepRecord;

/// One measured step, as reported. The JSON keys are the field names.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Step index.
    pub step: u64,
    /// Global loss; `null` when the model has none or it was not finite.
    pub loss: Option<f32>,
    /// Tokens of the global batch over the step's wall time.
    pub tokens_per_second: f64,
    /// Wall time of the step in seconds.
    pub seconds: f64,
    /// Measured bubble fraction ([`StepRecord::bubble_fraction`]).
    pub bubble_fraction: f64,
    /// Most stage-microbatches each pipeline device stashed at once.
    pub peak_stash: Vec<u32>,
    /// Most stash bytes each pipeline device held at once.
    pub peak_stash_bytes: Vec<u64>,
    /// Most bytes one forward's stash kept on each pipeline device.
    pub kept_per_microbatch: Vec<u64>,
    /// Optimizer state each rank held after the step, by global rank.
    pub optimizer_state_bytes: Vec<u64>,
    /// Each rank's measured memory, by global rank (device by device, `tp * dp` ranks each).
    pub memory: Vec<RankMemory>,
    /// Median advance of the steps' starts after the first, in ms, once two steps ran.
    pub steady_state_period_ms: Option<f64>,
    /// Whether the ranks' threads outnumbered this machine's cores.
    pub oversubscribed: bool,
}

/// A line that is not a [`StepReport`], naming the field that is wrong.
#[derive(Debug, thiserror::Error)]
pub enum StepReportError {
    /// Not JSON, or a field missing or of the wrong type (the source says which and how).
    #[error("step report{}", where_in(field))]
    Field {
        /// Where in the object (`memory[0].peak.parameters`; `.` for the object itself, as
        /// where a field is missing).
        field: String,
        /// What serde found there.
        #[source]
        source: serde_json::Error,
    },
}

/// ` field `x``, or nothing for the object itself (whose source names a missing field).
fn where_in(field: &str) -> String {
    if field == "." {
        String::new()
    } else {
        format!(" field `{field}`")
    }
}

impl StepReport {
    /// The report of a measured step: `tokens` of the global batch, the steady-state period
    /// measured so far, and whether the run's threads were oversubscribed.
    pub fn new(
        s: &StepRecord,
        tokens: f64,
        steady_state_period_ms: Option<f64>,
        oversubscribed: bool,
    ) -> Self {
        StepReport {
            step: s.step,
            loss: s.loss,
            tokens_per_second: tokens / s.seconds.max(1e-9),
            seconds: s.seconds,
            bubble_fraction: s.bubble_fraction(),
            peak_stash: s.peak_stash.clone(),
            peak_stash_bytes: s.peak_stash_bytes.clone(),
            kept_per_microbatch: s.kept_per_microbatch.clone(),
            optimizer_state_bytes: s.optimizer_state_bytes.clone(),
            memory: s.memory.clone(),
            steady_state_period_ms,
            oversubscribed,
        }
    }

    /// The report as one JSON line. Written through a `serde_json::Value`, as the line always
    /// was: keys in alphabetical order, a non-finite number as `null`.
    pub fn to_line(&self) -> Result<String, serde_json::Error> {
        Ok(serde_json::to_value(self)?.to_string())
    }

    /// Read one line written by [`StepReport::to_line`].
    pub fn from_line(line: &str) -> Result<Self, StepReportError> {
        let mut de = serde_json::Deserializer::from_str(line);
        serde_path_to_error::deserialize(&mut de).map_err(|e| StepReportError::Field {
            field: e.path().to_string(),
            source: e.into_inner(),
        })
    }

    /// Each pipeline device's fullest rank's measured peak in bytes, `ranks` (`tp * dp`) ranks
    /// to a device.
    pub fn device_peak_totals(&self, ranks: usize) -> Vec<u64> {
        self.memory
            .chunks(ranks.max(1))
            .map(|d| d.iter().map(|r| r.peak.total()).max().unwrap_or(0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_model::memory::MemoryBreakdown;

    fn report() -> StepReport {
        let peak = |p| MemoryBreakdown {
            parameters: p,
            activations: 10,
            ..MemoryBreakdown::default()
        };
        StepReport {
            step: 3,
            loss: Some(0.1),
            tokens_per_second: 1234.5,
            seconds: 0.25,
            bubble_fraction: 0.2,
            peak_stash: vec![2, 1],
            peak_stash_bytes: vec![64, 32],
            kept_per_microbatch: vec![32, 32],
            optimizer_state_bytes: vec![8, 8, 8, 8],
            memory: [5, 7, 3, 2]
                .map(|p| RankMemory {
                    peak: peak(p),
                    max: peak(p),
                    device: None,
                })
                .to_vec(),
            steady_state_period_ms: Some(12.5),
            oversubscribed: false,
        }
    }

    #[test]
    fn a_line_reads_back_as_written_with_keys_in_order() {
        let r = report();
        let line = r.to_line().unwrap();
        assert!(line.starts_with(r#"{"bubble_fraction":0.2,"kept_per_microbatch":[32,32],"loss":0.10000000149011612,"#), "{line}");
        let back = StepReport::from_line(&line).unwrap();
        assert_eq!(back.memory, r.memory);
        assert_eq!(back.steady_state_period_ms, Some(12.5));
        assert_eq!(back.device_peak_totals(2), vec![17, 13]);
    }

    #[test]
    fn a_non_finite_loss_and_no_period_are_null() {
        let r = StepReport {
            loss: Some(f32::NAN),
            steady_state_period_ms: None,
            ..report()
        };
        let line = r.to_line().unwrap();
        assert!(line.contains(r#""loss":null"#), "{line}");
        let back = StepReport::from_line(&line).unwrap();
        assert_eq!((back.loss, back.steady_state_period_ms), (None, None));
    }

    /// The error and its source on one line, as the CLI prints it.
    fn refused(v: &serde_json::Value) -> String {
        let e = StepReport::from_line(&v.to_string()).unwrap_err();
        let source = std::error::Error::source(&e).map(|s| s.to_string());
        format!("{e}: {}", source.unwrap_or_default())
    }

    #[test]
    fn a_malformed_line_is_refused_naming_the_field() {
        let mut v = serde_json::to_value(report()).unwrap();
        v["steady_state_period_ms"] = "soon".into();
        let e = refused(&v);
        assert!(
            e.starts_with("step report field `steady_state_period_ms`: invalid type: string"),
            "{e}"
        );
        v["steady_state_period_ms"] = 1.0.into();
        v["memory"][1]["peak"]["parameters"] = (-1).into();
        let e = refused(&v);
        assert!(
            e.starts_with("step report field `memory[1].peak.parameters`: invalid value"),
            "{e}"
        );
        v["memory"][1]["peak"]["parameters"] = 1.into();
        v.as_object_mut().unwrap().remove("seconds");
        let e = refused(&v);
        assert!(e.starts_with("step report: missing field `seconds`"), "{e}");
        let e = StepReport::from_line("not json").unwrap_err();
        assert_eq!(e.to_string(), "step report");
    }
}
