//! How to run this program again: `plan --validate` runs `train` as a child process. The
//! binary is its own executable; inside a host process (the Python console script, where the
//! executable is the interpreter) the host says how, once, before running.

use std::ffi::OsString;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result};

/// The host's command for this program (program, then leading arguments), if it set one.
static EMBEDDED: OnceLock<Vec<OsString>> = OnceLock::new();

/// Records the host's command line for this program. A process has one host, so a second
/// call (the console script's `main` run twice in one interpreter) keeps the first.
pub fn set(command: Vec<OsString>) {
    if !command.is_empty() {
        let _ = EMBEDDED.set(command);
    }
}

/// A [`Command`] that runs this program; the caller adds the subcommand and its flags.
pub fn command() -> Result<Command> {
    if let Some((program, lead)) = EMBEDDED.get().and_then(|c| c.split_first()) {
        let mut cmd = Command::new(program);
        cmd.args(lead);
        return Ok(cmd);
    }
    let exe = std::env::current_exe().context("finding this program to run `train`")?;
    Ok(Command::new(exe))
}
