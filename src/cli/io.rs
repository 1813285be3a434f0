//! Reading files: timetables, timelines, cost files, each named for what it is.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use super::memory::human;
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

    /// Judge JSON text by its top-level keys (the values are skipped, not built).
    pub fn of(text: &str) -> FileKind {
        type Keys = std::collections::HashMap<String, serde::de::IgnoredAny>;
        let Ok(map) = serde_json::from_str::<Keys>(text) else {
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

/// Largest file pipewright reads: far beyond any timetable, timeline, cost, cluster or
/// profile file it writes (a timeline of a million events is about 120 MB).
pub const MAX_INPUT: u64 = 1 << 30;

/// A text file's content without a UTF-8 byte-order mark; one line naming the file when it
/// cannot be read, is not text, is not a file (a folder, a device such as /dev/zero), or is
/// larger than [`MAX_INPUT`] (a pipe is read up to that much, then refused).
pub fn read_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let name = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {name}"))?;
    let kind = meta.file_type();
    if kind.is_dir() {
        bail!("{name} is a folder, not a file");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_block_device() || kind.is_socket() {
            bail!("{name} is a device, not a file");
        }
    }
    let limit = human(MAX_INPUT);
    if meta.is_file() && meta.len() > MAX_INPUT {
        bail!(
            "{name} is {}, more than the {limit} pipewright reads",
            human(meta.len())
        );
    }
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_INPUT + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {name}"))?;
    if bytes.len() as u64 > MAX_INPUT {
        bail!("{name} goes on past the {limit} pipewright reads");
    }
    // The text, and what is parsed from it, held at once.
    super::budget::fits(&format!("reading {name}"), bytes.len() as u64 * 8)?;
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
    // Checked as strictly as a timetable before anything is drawn or measured from it.
    tl.check().map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(tl)
}

/// Read a timetable file (PyTorch CSV, or pipewright JSON when it starts with `{`) and
/// validate it; errors name the file and, for CSV, the line and column.
pub fn load_timetable(path: &Path) -> Result<Timetable> {
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
    let Err(e) = validate(&tt) else { return Ok(tt) };
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
