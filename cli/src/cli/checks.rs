//! Checks run before any work: what an output holds (its extension), and numeric flags.
//! The outputs themselves are checked, staged and committed by `outputs.rs`.

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
}

impl Kind {
    pub(super) fn extensions(self) -> &'static [&'static str] {
        match self {
            Kind::Image => &["svg", "png"],
            Kind::Json => &["json"],
            Kind::Timetable => &["csv", "json"],
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

    #[test]
    fn counts_below_their_least_name_flag_and_least() {
        assert!(at_least("--vocab", 2, 2, "x").is_ok());
        let e = at_least("--vocab", 1, 2, "x").unwrap_err().to_string();
        assert_eq!(e, "--vocab 1: must be at least 2 (x)");
    }
}
