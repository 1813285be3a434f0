//! Reading timetables and writing files without ever leaving a half-written one.

use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use pipewright::schedule::{from_csv, validate, Timetable};

/// Write `bytes` to `path` atomically: a temporary file beside it, then a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|()| keep_permissions(tmp.as_file(), path))
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| anyhow!("cannot write {}: {}", path.display(), e.error))?;
    Ok(())
}

/// A replaced file keeps its mode; a new one gets the usual 0644 rather than the
/// temporary file's private 0600.
fn keep_permissions(tmp: &std::fs::File, path: &Path) -> std::io::Result<()> {
    let perms = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions(),
        Err(_) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::Permissions::from_mode(0o644)
            }
            #[cfg(not(unix))]
            return Ok(());
        }
    };
    tmp.set_permissions(perms)
}

/// Read a timetable file (PyTorch CSV, or pipewright JSON when it starts with `{`) and
/// validate it; errors name the file and, for CSV, the line and column.
pub fn load_timetable(path: &Path) -> Result<Timetable> {
    let name = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {name}"))?;
    let (tt, source) = if text.trim_start().starts_with('{') {
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
