//! Reading files: timetables, timelines, cost files, each named for what it is.

use std::path::Path;

use anyhow::{anyhow, Context, Result};

use pipewright::schedule::{from_csv, Checked, CostModel, Timeline, Timetable};

pub use pipewright::input::FileKind;

/// A text file's content without a UTF-8 byte-order mark; one line naming the file when it
/// cannot be read, is not text, is not a file (a folder, a device such as /dev/zero), or is
/// larger than [`MAX_INPUT`] (`pipewright::input::read_text`, which Python's reads call too).
pub fn read_text(path: &Path) -> Result<String> {
    Ok(pipewright::input::read_text(path)?)
}

/// Refuse JSON text of another kind than `want`, naming what it is.
fn expect_kind(path: &Path, text: &str, want: FileKind) -> Result<()> {
    Ok(pipewright::input::expect_kind(
        &path.display().to_string(),
        text,
        want,
    )?)
}

/// Read a cost file for a timetable of `stages` stages.
pub fn load_cost_file(path: &Path, stages: u32) -> Result<CostModel> {
    let text = read_text(path)?;
    expect_kind(path, &text, FileKind::CostFile)?;
    CostModel::from_json(&text, stages).with_context(|| path.display().to_string())
}

/// The `time_unit` a cost file names (`"ms"` from a measured run or a profile), for the
/// simulator's report: its times are in the file's unit, not in abstract units.
pub fn cost_file_time_unit(path: &Path) -> Result<Option<String>> {
    let text = read_text(path)?;
    let raw: pipewright::schedule::RawCostFile =
        serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(raw.time_unit)
}

/// Read a timeline JSON (`simulate --timeline`, `train --trace`), checked as strictly as a
/// timetable before anything is drawn or measured from it (the same reader as Python's).
pub fn load_timeline(path: &Path) -> Result<Timeline> {
    Ok(pipewright::input::read_timeline(path)?)
}

/// Read a timetable file (PyTorch CSV, or pipewright JSON when it starts with `{`) and
/// validate it; errors name the file and, for CSV, the line and column.
pub fn load_timetable(path: &Path) -> Result<Checked> {
    let name = path.display();
    let text = read_text(path)?;
    // The name decides the reader where it can, so a .json file's error is JSON's; other
    // names are judged by their first character.
    let json = match super::checks::extension(path).as_deref() {
        Some("json") => true,
        Some("csv") => false,
        _ => text.trim_start().starts_with(['{', '[']),
    };
    let (tt, source) = if json {
        expect_kind(path, &text, FileKind::Timetable)?;
        let tt: Timetable = serde_json::from_str(&text).map_err(|e| anyhow!("{name}: {e}"))?;
        (tt, None)
    } else {
        let (tt, source) = from_csv(&text).map_err(|e| anyhow!("{name}: {e}"))?;
        (tt, Some(source))
    };
    // Validating and simulating cost memory per action; its numbers are checked before any
    // table is built by them (the validator's `check_sparse`).
    let spm = (tt.compute_len() / 2) as u64;
    super::budget::timetable(&name.to_string(), spm, 1)?;
    let (e, tt) = match Checked::new_or_back(tt) {
        Ok(checked) => return Ok(checked),
        Err(bad) => *bad,
    };
    // Point at the cell in a CSV; a JSON timetable has no lines per action.
    let at = source.and_then(|src| src.locate(&e));
    let head = match at {
        Some((line, col)) => format!("{name}:{line}:{col}: {e}"),
        None => format!("{name}: {e}"),
    };
    Err(anyhow!(InvalidTimetable {
        head,
        grid: e.grid(&tt)
    }))
}

/// A validation failure, with the grid to show on request.
#[derive(Debug)]
pub struct InvalidTimetable {
    /// One line: file, position, what is wrong.
    pub head: String,
    /// The timetable with the failing step marked.
    pub grid: String,
}

impl std::fmt::Display for InvalidTimetable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.head)
    }
}

impl std::error::Error for InvalidTimetable {}
