//! Golden outputs of the `pipewright` binary: every case in `tests/golden/cases.txt` runs
//! and its exit code, stdout, stderr and the files it writes must equal, byte for byte,
//! `tests/golden/<case>.txt`. This guards restructurings (issue 34): it depends only on the
//! binary, never on a Rust module path, so it must pass unchanged when code moves.
//!
//! `GOLDEN_BLESS=1 cargo test -p pipewright-cli --test it golden::` rewrites the expected files (and removes those of
//! cases no longer listed); review the diff before committing it.
//!
//! Each case runs in its own temporary directory holding a copy of `tests/golden/inputs/` as
//! `inputs/`, so arguments and messages name relative paths that never vary. The one varying
//! figure, elapsed seconds, is replaced by `<elapsed>`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One line of `cases.txt`: `name: arg arg ...` (arguments split on whitespace).
struct Case {
    name: String,
    args: Vec<String>,
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(golden_dir().join("cases.txt")).expect("cases.txt");
    let mut out: Vec<Case> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, args) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("cases.txt line {}: no `name:`", n + 1));
        let name = name.trim().to_string();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "cases.txt line {}: case name `{name}` must be [A-Za-z0-9_-]",
            n + 1
        );
        assert!(
            !out.iter().any(|c| c.name == name),
            "cases.txt line {}: case `{name}` listed twice",
            n + 1
        );
        let args = args.split_whitespace().map(str::to_string).collect();
        out.push(Case { name, args });
    }
    out
}

fn copy_inputs(to: &Path) {
    let from = golden_dir().join("inputs");
    let to = to.join("inputs");
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Elapsed wall time is the one figure that varies run to run: `0.01 s` in text, and a
/// `"seconds"` field in JSON.
fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        out.push_str(&normalise_line(line));
    }
    out
}

fn normalise_line(line: &str) -> String {
    // JSON: "seconds": <number>
    let mut line = line.to_string();
    let key = "\"seconds\":";
    let mut from = 0;
    while let Some(at) = line[from..].find(key) {
        let start = from + at + key.len();
        let rest = &line[start..];
        let spaces = rest.len() - rest.trim_start().len();
        let num_len = rest[spaces..]
            .find(|c: char| !(c.is_ascii_digit() || ".eE+-".contains(c)))
            .unwrap_or(rest.len() - spaces);
        if num_len > 0 {
            line.replace_range(start + spaces..start + spaces + num_len, "\"<elapsed>\"");
        }
        from = start;
    }
    // Text: a decimal number followed by " s" at a word end, e.g. "in 0.00 s".
    let words: Vec<&str> = line.split(' ').collect();
    let mut out = Vec::with_capacity(words.len());
    for (k, w) in words.iter().enumerate() {
        let next = words.get(k + 1).copied().unwrap_or("");
        let unit = next == "s" || next.starts_with("s\n") || next.starts_with("s,");
        let decimal =
            w.contains('.') && !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '.');
        out.push(if unit && decimal { "<elapsed>" } else { w });
    }
    out.join(" ")
}

/// Runs a case and renders everything it produced as one text.
fn run_case(case: &Case) -> String {
    let dir = tempfile::tempdir().unwrap();
    copy_inputs(dir.path());
    let o = Command::new(env!("CARGO_BIN_EXE_pipewright"))
        .args(&case.args)
        .current_dir(dir.path())
        .env_remove("COLUMNS")
        .env_remove("LINES")
        .env_remove("RUST_BACKTRACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("the pipewright binary runs");
    let mut out = String::new();
    let _ = writeln!(out, "$ pipewright {}", case.args.join(" "));
    let _ = writeln!(out, "exit: {:?}", o.status.code());
    let _ = writeln!(out, "--- stdout");
    out.push_str(&normalise(&String::from_utf8_lossy(&o.stdout)));
    let _ = writeln!(out, "--- stderr");
    out.push_str(&normalise(&String::from_utf8_lossy(&o.stderr)));
    let mut written: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "inputs"))
        .collect();
    written.sort();
    for path in written {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let _ = writeln!(out, "--- file {name}");
        let bytes = std::fs::read(&path).unwrap();
        match String::from_utf8(bytes) {
            Ok(text) => out.push_str(&normalise(&text)),
            Err(e) => {
                let _ = writeln!(out, "<{} bytes, not text>", e.as_bytes().len());
            }
        }
    }
    out
}

/// The first differing line with a few lines around it, `-` expected and `+` actual.
fn short_diff(expected: &str, actual: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let first = (0..e.len().max(a.len()))
        .find(|&i| e.get(i) != a.get(i))
        .unwrap_or(0);
    let lo = first.saturating_sub(3);
    let mut out = String::new();
    for l in e.iter().take(first).skip(lo) {
        let _ = writeln!(out, "  {l}");
    }
    // The differing run (at most 6 lines), quoted when only whitespace differs.
    let end = (first + 1..first + 6)
        .find(|&i| e.get(i) == a.get(i))
        .unwrap_or(first + 6);
    let quote =
        (first..end).all(|i| e.get(i).map(|l| l.trim_end()) == a.get(i).map(|l| l.trim_end()));
    let show = |l: &str| {
        if quote {
            format!("{l:?}")
        } else {
            l.to_string()
        }
    };
    for (sign, lines) in [("-", &e), ("+", &a)] {
        for l in lines.iter().take(end).skip(first) {
            let _ = writeln!(out, "{sign} {}", show(l));
        }
    }
    let _ = writeln!(
        out,
        "(first difference at line {}; expected {} lines, got {})",
        first + 1,
        e.len(),
        a.len()
    );
    out
}

#[test]
fn cli_outputs_match_their_golden_files() {
    let bless = std::env::var_os("GOLDEN_BLESS").is_some_and(|v| v != "0" && !v.is_empty());
    let cases = cases();
    // Two threads: the cases are small processes, and the machines running this are shared.
    let results: Vec<String> = std::thread::scope(|s| {
        let (even, odd): (Vec<_>, Vec<_>) = cases.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let h1 = s.spawn(move || {
            even.into_iter()
                .map(|(i, c)| (i, run_case(c)))
                .collect::<Vec<_>>()
        });
        let h2 = s.spawn(move || {
            odd.into_iter()
                .map(|(i, c)| (i, run_case(c)))
                .collect::<Vec<_>>()
        });
        let mut all = h1.join().unwrap();
        all.extend(h2.join().unwrap());
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    });
    let mut failures = Vec::new();
    for (case, actual) in cases.iter().zip(&results) {
        let path = golden_dir().join(format!("{}.txt", case.name));
        if bless {
            std::fs::write(&path, actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if &expected != actual {
            failures.push(format!(
                "case `{}`: pipewright {}\n{}",
                case.name,
                case.args.join(" "),
                short_diff(&expected, actual)
            ));
        }
    }
    // A golden file of a case no longer listed is stale: removed when blessing, else an error.
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let is_case_file = path.extension().is_some_and(|e| e == "txt") && stem != "cases";
        if is_case_file && !cases.iter().any(|c| c.name == stem) {
            if bless {
                std::fs::remove_file(&path).unwrap();
            } else {
                failures.push(format!("{}: no such case in cases.txt", path.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) differ (rerun with GOLDEN_BLESS=1 to accept the new outputs):\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_normaliser_replaces_only_elapsed_time() {
    assert_eq!(
        normalise("87 candidates, 0 skipped, 0.00 s\nin 12.5 s\nstep s 0.013, 2.5 ms\n"),
        "87 candidates, 0 skipped, <elapsed> s\nin <elapsed> s\nstep s 0.013, 2.5 ms\n"
    );
    assert_eq!(
        normalise("{\"seconds\":0.0026,\"x\":1}\n{\"seconds\": 3e-5}"),
        "{\"seconds\":\"<elapsed>\",\"x\":1}\n{\"seconds\": \"<elapsed>\"}"
    );
}
