//! What the end-to-end tests of the `pipewright` binary share: running it, and the two
//! outcomes they assert, a success's stdout and a refusal's one line.
// Each test binary includes this module and uses its own part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `pipewright args` in `dir` (the test's own working directory when `None`).
pub fn run_in(dir: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipewright"));
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd.args(args).output().expect("the pipewright binary runs")
}

/// Runs `pipewright args` in the test's working directory.
pub fn run(args: &[&str]) -> Output {
    run_in(None, args)
}

/// The stdout of `o`, which must have succeeded without a panic (its stderr says why not).
pub fn succeeded(o: &Output, args: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The stdout of `pipewright args` run in `dir`, which must succeed.
pub fn ok_in(dir: Option<&Path>, args: &[&str]) -> String {
    succeeded(&run_in(dir, args), args)
}

/// The stdout of `pipewright args`, which must succeed.
pub fn ok(args: &[&str]) -> String {
    ok_in(None, args)
}

/// `o` is a refusal: exit status `code` (any failure when `None`), exactly one stderr line
/// that starts with `error: `, holds every needle and is no panic. Returns that line.
pub fn refusal(o: &Output, args: &[&str], code: Option<i32>, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    match code {
        Some(code) => assert_eq!(o.status.code(), Some(code), "{args:?}: {err}"),
        None => assert!(!o.status.success(), "{args:?} succeeded"),
    }
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in {err}");
    }
    err
}

/// `pipewright args` run in `dir` is refused as [`refusal`] says.
pub fn refused_in(
    dir: Option<&Path>,
    args: &[&str],
    code: Option<i32>,
    needles: &[&str],
) -> String {
    refusal(&run_in(dir, args), args, code, needles)
}

/// `pipewright args` exits 1 with one `error: ` line holding every needle.
pub fn refused(args: &[&str], needles: &[&str]) -> String {
    refused_in(None, args, Some(1), needles)
}

/// The same for the tests of `pipewright plan`: every call runs `plan` with the arguments.
pub mod plan {
    use std::process::Output;

    /// `pipewright plan args`.
    pub fn run(args: &[&str]) -> Output {
        let mut all = vec!["plan"];
        all.extend_from_slice(args);
        super::run(&all)
    }

    /// The stdout of `pipewright plan args`, which must succeed.
    pub fn ok(args: &[&str]) -> String {
        super::succeeded(&run(args), args)
    }

    /// `pipewright plan args` fails with one `error: ` line holding every needle.
    pub fn refused(args: &[&str], needles: &[&str]) {
        super::refusal(&run(args), args, None, needles);
    }
}
