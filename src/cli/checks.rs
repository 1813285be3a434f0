//! Checks run before any work: every output path a command will write, and numeric flags.
//!
//! A command lists its outputs once, at its start, so that a missing folder, an unknown
//! extension or two flags naming one file fail in a second instead of after the run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// What a file written by a command holds; decides the extensions it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A chart: `.svg` or `.png`.
    Image,
    /// JSON: `.json` (timelines, cost files, Chrome traces).
    Json,
    /// A timetable: `.csv` (PyTorch's form) or `.json`.
    Timetable,
    /// Text for people: `.txt`.
    Text,
}

impl Kind {
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Kind::Image => &["svg", "png"],
            Kind::Json => &["json"],
            Kind::Timetable => &["csv", "json"],
            Kind::Text => &["txt"],
        }
    }
}

/// One file a command will write: the flag that names it, the path, what it holds.
#[derive(Clone, Debug)]
pub struct Output<'a> {
    /// The flag, e.g. `--chart`.
    pub flag: &'static str,
    /// Where it goes.
    pub path: &'a Path,
    /// What it holds.
    pub kind: Kind,
}

impl<'a> Output<'a> {
    /// An output named by `flag` when the flag was given.
    pub fn new(flag: &'static str, path: Option<&'a PathBuf>, kind: Kind) -> Option<Self> {
        path.map(|p| Output {
            flag,
            path: p.as_path(),
            kind,
        })
    }
}

/// The lower-case extension of a path, if any.
pub fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Check every output before any work: its extension fits what it holds, its folder exists
/// and takes new files, it is not a folder itself, and no two outputs share a path.
pub fn check_outputs<'a>(outputs: impl IntoIterator<Item = Option<Output<'a>>>) -> Result<()> {
    let mut seen: HashMap<PathBuf, &'static str> = HashMap::new();
    for out in outputs.into_iter().flatten() {
        let (flag, path) = (out.flag, out.path);
        let exts = out.kind.extensions();
        if !extension(path).is_some_and(|e| exts.contains(&e.as_str())) {
            let list: Vec<String> = exts.iter().map(|e| format!(".{e}")).collect();
            bail!(
                "{flag} {}: use a {} file name, so that the file can be read back",
                path.display(),
                list.join(" or ")
            );
        }
        let key = writable(flag, path)?;
        if let Some(other) = seen.insert(key, flag) {
            bail!(
                "{other} and {flag} both name {}: give each output its own file",
                path.display()
            );
        }
    }
    Ok(())
}

/// The path's identity (its folder resolved, then its name), once the folder is known to
/// exist and take new files.
fn writable(flag: &str, path: &Path) -> Result<PathBuf> {
    let shown = path.display();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Some(name) = path.file_name() else {
        bail!("{flag} {shown}: not a file name");
    };
    if path.is_dir() {
        bail!("{flag} {shown} is a folder: give a file name");
    }
    let Ok(resolved) = dir.canonicalize() else {
        bail!(
            "{flag} {shown}: folder {} does not exist; create it first",
            dir.display()
        );
    };
    if !resolved.is_dir() {
        bail!("{flag} {shown}: {} is not a folder", dir.display());
    }
    // The file is written as a temporary file in this folder, then renamed: try that now.
    if let Err(e) = tempfile::NamedTempFile::new_in(&resolved) {
        bail!(
            "{flag} {shown}: cannot write in folder {}: {e}",
            dir.display()
        );
    }
    Ok(resolved.join(name))
}

/// A finite number in `(low, high]`, or one line naming the flag, the value and the range.
pub fn in_range<T>(flag: &str, value: T, low: f64, high: f64, why: &str) -> Result<()>
where
    T: Into<f64> + std::fmt::Display + Copy,
{
    let x: f64 = value.into();
    if !(x.is_finite() && x > low && x <= high) {
        bail!("{flag} {value}: must be a finite number above {low} and at most {high} ({why})");
    }
    Ok(())
}

/// A whole number of at least `min`, or one line naming the flag and why.
pub fn at_least(flag: &str, value: usize, min: usize, why: &str) -> Result<()> {
    if value < min {
        bail!("{flag} {value}: must be at least {min} ({why})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out<'a>(flag: &'static str, p: &'a Path, kind: Kind) -> Option<Output<'a>> {
        Some(Output {
            flag,
            path: p,
            kind,
        })
    }

    #[test]
    fn outputs_are_refused_before_work_with_the_flag_named() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("c.png");
        let same = dir.path().join(".").join("c.png");
        let e = check_outputs([
            out("--trace", &png, Kind::Image),
            out("--chart", &same, Kind::Image),
        ])
        .unwrap_err();
        assert!(
            e.to_string().starts_with("--trace and --chart both name"),
            "{e}"
        );
        let e = check_outputs([out("--chart", Path::new("nodir/c.png"), Kind::Image)]).unwrap_err();
        assert!(e.to_string().contains("folder nodir does not exist"), "{e}");
        let e = check_outputs([out("--trace", &png, Kind::Json)]).unwrap_err();
        assert!(e.to_string().contains("use a .json file name"), "{e}");
        let e = check_outputs([out("-o", dir.path(), Kind::Image)]).unwrap_err();
        assert!(e.to_string().contains("use a .svg or .png"), "{e}");
        check_outputs([out("--chart", &png, Kind::Image), None]).unwrap();
    }

    #[test]
    fn numbers_out_of_range_name_flag_and_range() {
        assert!(in_range("--lr", 1e-3, 0.0, 10.0, "x").is_ok());
        for bad in [f64::NAN, -1.0, 0.0, 1e30, f64::INFINITY] {
            let e = in_range("--lr", bad, 0.0, 10.0, "x")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("--lr ") && e.contains("above 0"), "{e}");
        }
        assert!(at_least("--vocab", 1, 2, "x").is_err());
    }
}
