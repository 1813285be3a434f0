//! `plan`'s searched rows (`schedule::plan::listed`): a timetable no `--schedule` names, so
//! `--timetable-out` writes it and the launch line hands it to `train --timetable`.

use std::path::Path;

use anyhow::Result;
use pipewright::schedule::plan::PlanRow;
use pipewright::schedule::Timetable;

use super::timetable_out::CommsArg;

/// The best's timetable when it is a searched one.
pub fn timetable(best: &PlanRow) -> Option<&Timetable> {
    best.searched.as_ref().map(|s| s.timetable.timetable())
}

/// The text of the best's searched timetable for `path` (CSV in PyTorch's form,
/// compute-only or with `comms` compute+comms, or JSON); `None` when the best is a generator
/// family's (nothing to write).
pub fn text(best: &PlanRow, path: &Path, comms: CommsArg) -> Result<Option<String>> {
    let (Some(s), Some(tt)) = (best.searched.as_ref(), timetable(best)) else {
        return Ok(None);
    };
    let mut tt = tt.clone();
    tt.name = format!("plan: searched ({})", s.label);
    comms.text(&tt, path).map(Some)
}
