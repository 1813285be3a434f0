//! Every file a command writes goes through here, in three moves:
//!
//! 1. [`Outputs::plan`], before any work: the command declares the files it reads and the
//!    files it will write. Each output's name must fit what it holds, its folder must exist
//!    and take new files, no two outputs may be one file, and no output may be one of the
//!    inputs (the same path, `./` spellings, symbolic links and hard links alike), so that a
//!    typo cannot destroy what the run reads.
//! 2. [`Outputs::stage`], as each output is ready: its bytes go to a temporary file beside
//!    its target (the write that can fail, on a full disk, fails here, touching nothing).
//! 3. [`Outputs::commit`], once all are staged: each temporary file is renamed over its
//!    target. A rename that fails puts back the files the earlier ones replaced, so the
//!    outputs change together or not at all. Dropped uncommitted, the staged files vanish.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tempfile::NamedTempFile;

use super::checks::{extension, Kind, Output};

/// A file a command reads, named by the flag that gives it.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The flag, e.g. `--timetable`.
    pub flag: &'static str,
    /// The path given.
    pub path: &'a Path,
}

impl<'a> Input<'a> {
    /// The input named by `flag` when the flag was given.
    pub fn new(flag: &'static str, path: Option<&'a PathBuf>) -> Option<Self> {
        path.map(|p| Input {
            flag,
            path: p.as_path(),
        })
    }

    /// An input given as a string that may name a file or something else (a preset): only
    /// an existing file counts.
    pub fn maybe_file(flag: &'static str, arg: &'a str) -> Option<Self> {
        let path = Path::new(arg);
        path.is_file().then_some(Input { flag, path })
    }
}

/// What makes two paths one file: the device and inode where it exists (hard links and
/// symbolic links included), else its resolved folder and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Identity {
    Inode(u64, u64),
    Path(PathBuf),
}

fn inode(path: &Path) -> Option<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path)
            .ok()
            .map(|m| Identity::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        path.canonicalize().ok().map(Identity::Path)
    }
}

/// One output, checked: where it goes and the folder its temporary file is made in.
#[derive(Debug)]
struct Planned {
    flag: &'static str,
    path: PathBuf,
    dir: PathBuf,
}

/// A staged output: its bytes in a temporary file beside the target.
struct Staged {
    flag: &'static str,
    tmp: NamedTempFile,
    note: Option<String>,
}

/// The files one command writes, checked before the work and committed together after it.
pub struct Outputs {
    planned: Vec<Planned>,
    staged: Vec<Staged>,
}

impl Outputs {
    /// Check every output against the others and against every input, before any work.
    pub fn plan<'a>(
        inputs: impl IntoIterator<Item = Option<Input<'a>>>,
        outputs: impl IntoIterator<Item = Option<Output<'a>>>,
    ) -> Result<Outputs> {
        let inputs: Vec<(Input, Identity)> = inputs
            .into_iter()
            .flatten()
            .filter_map(|i| inode(i.path).map(|id| (i, id)))
            .collect();
        let mut seen: HashMap<Identity, &'static str> = HashMap::new();
        let mut planned = Vec::new();
        for out in outputs.into_iter().flatten() {
            let (flag, path) = (out.flag, out.path);
            check_extension(flag, path, out.kind)?;
            let (dir, name) = writable(flag, path)?;
            let ids = [Some(Identity::Path(dir.join(&name))), inode(path)];
            for id in ids.into_iter().flatten() {
                if let Some((input, _)) = inputs.iter().find(|(_, i)| *i == id) {
                    bail!(
                        "{flag} {} is the file {} {} reads: writing it would destroy the input; give {flag} another file",
                        path.display(),
                        input.flag,
                        input.path.display()
                    );
                }
                if let Some(other) = seen.insert(id, flag) {
                    bail!(
                        "{other} and {flag} both name {}: give each output its own file",
                        path.display()
                    );
                }
            }
            planned.push(Planned {
                flag,
                path: path.to_path_buf(),
                dir,
            });
        }
        Ok(Outputs {
            planned,
            staged: Vec::new(),
        })
    }

    /// Whether `flag` names an output of this command.
    pub fn has(&self, flag: &str) -> bool {
        self.planned.iter().any(|p| p.flag == flag)
    }

    /// The path `flag` names, when it was planned.
    pub fn path(&self, flag: &str) -> Option<&Path> {
        self.planned
            .iter()
            .find(|p| p.flag == flag)
            .map(|p| p.path.as_path())
    }

    /// Write `bytes` for the output `flag` into a temporary file beside its target; on
    /// commit, `wrote PATH` is said on stderr.
    pub fn stage(&mut self, flag: &'static str, bytes: &[u8]) -> Result<()> {
        self.stage_noted(flag, bytes, None)
    }

    /// As [`stage`](Self::stage), saying `note` instead of `wrote PATH` on commit.
    pub fn stage_noted(
        &mut self,
        flag: &'static str,
        bytes: &[u8],
        note: Option<String>,
    ) -> Result<()> {
        let Some(p) = self.planned.iter().find(|p| p.flag == flag) else {
            bail!("internal: output {flag} was not planned");
        };
        let shown = p.path.display();
        let mut tmp = NamedTempFile::new_in(&p.dir)
            .with_context(|| format!("{flag} {shown}: cannot write in {}", p.dir.display()))?;
        tmp.write_all(bytes)
            .and_then(|()| keep_permissions(tmp.as_file(), &p.path))
            .and_then(|()| tmp.as_file().sync_all())
            .with_context(|| format!("{flag}: cannot write {shown}"))?;
        self.staged.retain(|s| s.flag != flag);
        self.staged.push(Staged { flag, tmp, note });
        Ok(())
    }

    /// Rename every staged file over its target, all or none: a failed rename puts back
    /// what the earlier ones replaced. Then say what was written.
    pub fn commit(mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        let mut done: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
        let mut notes = Vec::new();
        for s in staged {
            let Some(p) = self.planned.iter().find(|p| p.flag == s.flag) else {
                continue;
            };
            // Keep the old file under a second name until every rename has succeeded.
            let backup = p.path.is_file().then(|| backup_of(&p.path)).flatten();
            if let Err(e) = s.tmp.persist(&p.path) {
                undo(done);
                if let Some(b) = backup {
                    let _ = std::fs::remove_file(b);
                }
                return Err(anyhow!(
                    "{} {}: cannot write: {} (no output was changed)",
                    s.flag,
                    p.path.display(),
                    e.error
                ));
            }
            notes.push(
                s.note
                    .unwrap_or_else(|| format!("wrote {}", p.path.display())),
            );
            done.push((p.path.clone(), backup));
        }
        for (_, backup) in done {
            if let Some(b) = backup {
                let _ = std::fs::remove_file(b);
            }
        }
        for n in notes {
            super::console::note(&n);
        }
        Ok(())
    }
}

/// Put back each replaced file from its backup, and remove each new one.
fn undo(done: Vec<(PathBuf, Option<PathBuf>)>) {
    for (path, backup) in done.into_iter().rev() {
        match backup {
            Some(b) => {
                let _ = std::fs::rename(b, &path);
            }
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// A second name (a hard link) for an existing file, beside it; `None` where the file
/// system has no hard links (the commit is then all-or-nothing up to the rename itself).
fn backup_of(path: &Path) -> Option<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name()?.to_string_lossy();
    for i in 0..100 {
        let b = dir.join(format!(".{name}.pipewright-old{}{i}", std::process::id()));
        if std::fs::hard_link(path, &b).is_ok() {
            return Some(b);
        }
    }
    None
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

/// The output's name fits what it holds, so that the file can be read back.
fn check_extension(flag: &str, path: &Path, kind: Kind) -> Result<()> {
    let exts = kind.extensions();
    if !extension(path).is_some_and(|e| exts.contains(&e.as_str())) {
        let list: Vec<String> = exts.iter().map(|e| format!(".{e}")).collect();
        bail!(
            "{flag} {}: use a {} file name, so that the file can be read back",
            path.display(),
            list.join(" or ")
        );
    }
    Ok(())
}

/// The path's resolved folder and its name, once the folder is known to exist and take
/// new files.
fn writable(flag: &str, path: &Path) -> Result<(PathBuf, std::ffi::OsString)> {
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
    if path.exists() && !path.is_file() {
        bail!("{flag} {shown} is not a regular file: give a file name");
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
    if let Err(e) = NamedTempFile::new_in(&resolved) {
        bail!(
            "{flag} {shown}: cannot write in folder {}: {e}",
            dir.display()
        );
    }
    Ok((resolved, name.to_os_string()))
}

#[cfg(test)]
mod tests;
