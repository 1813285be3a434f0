//! Reading files: timetables, timelines, cost files, each named for what it is.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use pipewright::schedule::{from_csv, validate, CostModel, Timeline, Timetable};

/// What a file is, judged from its content, so that a file given where another kind is
/// wanted is named for what it is ("this is a cost file, not a timetable").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A pipewright timetable (JSON).
    Timetable,
    /// A timeline (`simulate --timeline`, `train --trace`).
    Timeline,
    /// A cost file (`--cost-file`, `--costs-out`).
    CostFile,
    /// JSON of another kind.
    OtherJson,
    /// Not JSON: a PyTorch CSV timetable, or something else.
    Text,
}

impl FileKind {
    /// What the file is, with the flag that reads it.
    fn describe(self) -> &'static str {
        match self {
            FileKind::Timetable => "a timetable (give it as --timetable)",
            FileKind::Timeline => "a timeline (draw it with viz --from)",
            FileKind::CostFile => "a cost file (give it as --cost-file)",
            FileKind::OtherJson => "JSON of no kind pipewright reads",
            FileKind::Text => "not JSON",
        }
    }

    /// Judge JSON text by its top-level keys.
    pub fn of(text: &str) -> FileKind {
        let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
            return if text.trim_start().starts_with(['{', '[']) {
                FileKind::OtherJson
            } else {
                FileKind::Text
            };
        };
        let has = |k: &str| map.contains_key(k);
        if has("devices") && (has("stage_device") || has("microbatches")) {
            FileKind::Timetable
        } else if has("events") || has("meta") {
            FileKind::Timeline
        } else if ["default", "stages", "p2p_latency", "bandwidth", "time_unit"]
            .iter()
            .any(|k| has(k))
        {
            FileKind::CostFile
        } else {
            FileKind::OtherJson
        }
    }
}

/// A text file's content without a UTF-8 byte-order mark; one line naming the file when it
/// cannot be read or is not text.
pub fn read_text(path: &Path) -> Result<String> {
    let name = path.display();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {name}"))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow!(
            "{name} is not a text file (not UTF-8 at byte {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// Refuse JSON text of another kind than `want`, naming what it is.
fn expect_kind(path: &Path, text: &str, want: FileKind) -> Result<()> {
    match FileKind::of(text) {
        k if k == want || k == FileKind::OtherJson || k == FileKind::Text => Ok(()),
        k => bail!(
            "{} is {}, not {}",
            path.display(),
            k.describe(),
            match want {
                FileKind::Timetable => "a timetable",
                FileKind::Timeline => "a timeline",
                _ => "a cost file",
            }
        ),
    }
}

/// Read a cost file for a timetable of `stages` stages.
pub fn load_cost_file(path: &Path, stages: u32) -> Result<CostModel> {
    let text = read_text(path)?;
    expect_kind(path, &text, FileKind::CostFile)?;
    CostModel::from_json(&text, stages).with_context(|| path.display().to_string())
}

/// Read a timeline JSON (`simulate --timeline`, `train --trace`).
pub fn load_timeline(path: &Path) -> Result<Timeline> {
    let text = read_text(path)?;
    expect_kind(path, &text, FileKind::Timeline)?;
    let tl: Timeline = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a timeline JSON", path.display()))?;
    // Per-device figures allocate by `meta.devices`: a corrupt count must not exhaust memory.
    const MAX_DEVICES: u32 = 1 << 16;
    let meta = &tl.meta;
    if meta.devices == 0 || meta.devices > MAX_DEVICES || meta.stages > MAX_DEVICES * 64 {
        bail!(
            "{}: meta says {} devices and {} stages; expected 1 to {MAX_DEVICES} devices",
            path.display(),
            meta.devices,
            meta.stages
        );
    }
    if let Some(e) = tl.events.iter().find(|e| e.device >= meta.devices) {
        bail!(
            "{}: an event runs on device {}, but meta says {} devices",
            path.display(),
            e.device,
            meta.devices
        );
    }
    Ok(tl)
}

/// Read a timetable file (PyTorch CSV, or pipewright JSON when it starts with `{`) and
/// validate it; errors name the file and, for CSV, the line and column.
pub fn load_timetable(path: &Path) -> Result<Timetable> {
    let name = path.display();
    let text = read_text(path)?;
    let (tt, source) = if text.trim_start().starts_with(['{', '[']) {
        expect_kind(path, &text, FileKind::Timetable)?;
        let tt: Timetable = serde_json::from_str(&text).map_err(|e| anyhow!("{name}: {e}"))?;
        (tt, None)
    } else {
        let (tt, source) = from_csv(&text).map_err(|e| anyhow!("{name}: {e}"))?;
        (tt, Some(source))
    };
    let Err(e) = validate(&tt) else { return Ok(tt) };
    // Point at the cell in a CSV; a JSON timetable has no lines per action.
    let at = source.and_then(|src| {
        let l = e.at?;
        l.step
            .and_then(|(s, _)| src.line_col(l.device, s))
            .or(Some((l.device as usize + 1, 1)))
    });
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
