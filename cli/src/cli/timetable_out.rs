//! Which bytes a timetable output holds, the same for every command that writes one
//! (`schedule -o`, `search --timetable-out`, `plan --timetable-out`): `.csv` is PyTorch's
//! compute-only form, or with `--comms` its compute+comms form; `.json` is pipewright's own.
//! What PyTorch cannot run (recomputation) is refused in one line by the schedule crate.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use pipewright::schedule::{write_csv, CsvForm, Timetable};

use super::checks::extension;

/// `--comms`, one flag with one meaning wherever a timetable is written.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct CommsArg {
    /// Write a .csv timetable in PyTorch's compute+comms form (its sends, receives and their
    /// waits, as `_PipelineScheduleRuntime._load_csv(path, format="compute_comms")` reads
    /// it) instead of its compute-only form (what `_load_csv(path)` and torchtitan read).
    #[arg(long)]
    pub comms: bool,
}

impl CommsArg {
    /// The CSV form asked for.
    pub fn form(self) -> CsvForm {
        if self.comms {
            CsvForm::ComputeComms
        } else {
            CsvForm::ComputeOnly
        }
    }

    /// Refuse `--comms` where no CSV timetable is written: `out` is the timetable output's
    /// flag and path, when there is one.
    pub fn check(self, out: Option<(&str, &Path)>) -> Result<()> {
        if !self.comms {
            return Ok(());
        }
        match out {
            None => bail!("--comms applies to a timetable written as CSV, and none is (add --timetable-out FILE.csv, or leave --comms out)"),
            Some((flag, path)) if extension(path).as_deref() != Some("csv") => bail!(
                "--comms applies to a .csv timetable (PyTorch's compute+comms form), but {flag} {} is not one: use a .csv file name or leave --comms out",
                path.display()
            ),
            Some(_) => Ok(()),
        }
    }

    /// The text of `tt` for `path`: CSV in the form asked for, or JSON.
    pub fn text(self, tt: &Timetable, path: &Path) -> Result<String> {
        if extension(path).as_deref() == Some("json") {
            return Ok(serde_json::to_string_pretty(tt)? + "\n");
        }
        self.csv(tt)
    }

    /// `tt` as CSV in the form asked for, or why PyTorch cannot run it.
    pub fn csv(self, tt: &Timetable) -> Result<String> {
        write_csv(tt, self.form()).map_err(|e| anyhow!("{e}"))
    }
}
