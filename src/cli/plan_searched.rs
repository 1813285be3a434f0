//! `plan`'s searched rows (`schedule::plan::listed`): a timetable no `--schedule` names, so
//! `--timetable-out` writes it and the launch line hands it to `train --timetable`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use pipewright::schedule::plan::PlanRow;
use pipewright::schedule::{lower, simulate, to_csv, CostModel, Simulation, Timetable};

use super::checks::extension;

/// What the launch line calls the timetable when `--timetable-out` was not given.
const PLACEHOLDER: &str = "TIMETABLE.csv";

/// The best's timetable when it is a searched one.
pub fn timetable(best: &PlanRow) -> Option<&Timetable> {
    best.searched.as_ref().map(|s| &s.timetable)
}

/// The best's searched timetable as the text of `path` (CSV in PyTorch's form, lowered, or
/// JSON); `None` when the best is a generator family's (nothing to write).
pub fn text(best: &PlanRow, path: &Path) -> Result<Option<String>> {
    let (Some(s), Some(tt)) = (best.searched.as_ref(), timetable(best)) else {
        return Ok(None);
    };
    let mut tt = tt.clone();
    tt.name = format!("plan: searched ({})", s.label);
    let text = if extension(path).as_deref() == Some("json") {
        serde_json::to_string_pretty(&tt)? + "\n"
    } else {
        to_csv(&lower(&tt).map_err(|e| anyhow!("{e}"))?)
    };
    Ok(Some(text))
}

/// The schedule flags of the launch line: the family's, or for a searched best the
/// timetable file that replaces them (its microbatches, stages and order are in the file).
pub fn schedule_flags(best: &PlanRow, out: Option<&PathBuf>) -> String {
    let c = &best.config;
    if best.searched.is_some() {
        let file = out.map_or(PLACEHOLDER.to_string(), |p| p.display().to_string());
        return format!("--timetable {file}");
    }
    format!(
        "--schedule {} --stages {} --virtual {} --microbatches {}",
        c.schedule, c.pp, c.v, c.microbatches
    )
}

/// The one line a searched best needs when no `--timetable-out` was given.
pub fn note(best: &PlanRow, out: Option<&PathBuf>) -> Option<String> {
    (best.searched.is_some() && out.is_none()).then(|| {
        format!("  (the best is a searched timetable no --schedule names: add --timetable-out {PLACEHOLDER} to this plan to write it)\n")
    })
}

/// One step of the best's searched timetable, for its chart.
pub fn one_step(best: &PlanRow, costs: &CostModel) -> Option<Result<Simulation>> {
    timetable(best).map(|tt| simulate(tt, costs).map_err(|e| anyhow!("{e}")))
}
