//! Outputs, by class of failure (issue 25): an output that is also an input is refused
//! before any work, outputs change all together or not at all, and a failed write to
//! standard output is a quiet end (a closed pipe) or one `error:` line, never a panic.

use std::path::Path;
use std::process::{Command, Stdio};

use proptest::prelude::*;

use crate::common;

fn refused(dir: &Path, args: &[&str], needles: &[&str]) {
    common::refused_in(Some(dir), args, Some(1), needles);
}

fn ok(dir: &Path, args: &[&str]) -> String {
    common::ok_in(Some(dir), args)
}

/// Every file of `dir` (name and bytes), sorted.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn class1_an_output_that_is_an_input_is_refused_before_any_work() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    ok(d, &["schedule", "-p", "2", "-m", "4", "-o", "X.json"]);
    ok(
        d,
        &["simulate", "-p", "2", "-m", "4", "--timeline", "tl.json"],
    );
    std::fs::write(d.join("cost.json"), r#"{"default": {"f": 1, "b": 2}}"#).unwrap();
    std::os::unix::fs::symlink("X.json", d.join("link.json")).unwrap();
    std::fs::hard_link(d.join("cost.json"), d.join("hard.json")).unwrap();
    std::os::unix::fs::symlink("tl.json", d.join("tl.svg")).unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    // The memory model's --hf-config is an input too (simulate and search wrote over it).
    std::fs::write(
        d.join("hf.json"),
        r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 16, "vocab_size": 64}"#,
    )
    .unwrap();
    std::fs::hard_link(d.join("hf.json"), d.join("hard-hf.json")).unwrap();
    let before = snapshot(d);
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["simulate", "--timetable", "X.json", "--timeline", "X.json"],
            "--timeline",
            "--timetable",
        ),
        (
            &[
                "simulate",
                "--timetable",
                "./X.json",
                "--trace",
                "sub/../X.json",
            ],
            "--trace",
            "--timetable",
        ),
        (
            &[
                "search",
                "--memory-cap",
                "4",
                "--cost-file",
                "cost.json",
                "--timetable-out",
                "hard.json",
            ],
            "--timetable-out",
            "--cost-file",
        ),
        (
            &[
                "train",
                "--timetable",
                "link.json",
                "--costs-out",
                "X.json",
                "--steps",
                "1",
            ],
            "--costs-out",
            "--timetable",
        ),
        (
            &["bench", "--timetable", "X.json", "--costs-out", "link.json"],
            "--costs-out",
            "--timetable",
        ),
        (
            &["plan", "--cluster", "cost.json", "--calibrate", "hard.json"],
            "--calibrate",
            "--cluster",
        ),
        (
            &["viz", "--from", "tl.json", "-o", "tl.svg"],
            "-o",
            "--from",
        ),
        (
            &[
                "simulate",
                "--hf-config",
                "hf.json",
                "--accounting",
                "megatron",
                "--timeline",
                "./hf.json",
            ],
            "--timeline",
            "--hf-config",
        ),
        (
            &[
                "search",
                "-p",
                "2",
                "-m",
                "4",
                "--memory-cap",
                "80GiB",
                "--hf-config",
                "hf.json",
                "--accounting",
                "megatron",
                "--timetable-out",
                "hard-hf.json",
            ],
            "--timetable-out",
            "--hf-config",
        ),
    ];
    for (args, out, inp) in cases {
        let started = std::time::Instant::now();
        refused(d, args, &[out, inp, "destroy"]);
        assert!(
            started.elapsed().as_secs() < 5,
            "{args:?} did the work first"
        );
    }
    // --calibrate plans nothing: a model beside it (which it overwrote) is refused by name.
    let args = ["plan", "--hf-config", "hf.json", "--calibrate", "./hf.json"];
    common::refused_in(Some(d), &args, None, &["--calibrate", "--hf-config"]);
    // So is a mixture's layout, which it would ignore.
    let args = ["plan", "--calibrate", "./c.json", "--ep", "2"];
    common::refused_in(
        Some(d),
        &args,
        None,
        &["--calibrate", "--ep does not apply"],
    );
    assert_eq!(snapshot(d), before, "a refused run changed a file");
}

/// The largest size (KiB) a shell may write under `ulimit -f`, with SIGXFSZ ignored so that
/// a write past it fails instead of killing the process.
fn limited(dir: &Path, kib: u64, args: &[&str]) -> std::process::Output {
    let script = format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\"",);
    Command::new("bash")
        .current_dir(dir)
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_pipewright"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn class2_when_a_later_output_fails_no_earlier_one_has_changed() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let args = [
        "simulate",
        "-p",
        "8",
        "-m",
        "64",
        "--timeline",
        "a.json",
        "--trace",
        "b.json",
    ];
    ok(d, &args);
    let (a, b) = (
        std::fs::metadata(d.join("a.json")).unwrap().len(),
        std::fs::metadata(d.join("b.json")).unwrap().len(),
    );
    assert!(
        b > a + 4096,
        "the trace ({b}) is not larger than the timeline ({a})"
    );
    std::fs::remove_file(d.join("b.json")).unwrap();
    std::fs::write(d.join("a.json"), "old").unwrap();
    // Room for the timeline, not for the trace: the trace's write fails (a full disk).
    let o = limited(d, a / 1024 + 2, &args);
    common::refusal(&o, &args, Some(1), &["--trace", "b.json"]);
    assert_eq!(snapshot(d), vec![("a.json".to_string(), b"old".to_vec())]);
    // With room for both, both change.
    ok(d, &args);
    assert_eq!(std::fs::metadata(d.join("a.json")).unwrap().len(), a);
}

#[test]
fn class4_a_closed_pipe_ends_quietly_and_a_full_disk_is_one_line() {
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let big: &[&[&str]] = &[
        &["schedule", "-p", "64", "-m", "512"],
        &["schedule", "-p", "64", "-m", "512", "--format", "json"],
        &[
            "simulate",
            "-p",
            "64",
            "-m",
            "256",
            "--format",
            "json",
            "--memory-series",
        ],
        // Slow to start writing, so its reader is long gone even for a short table.
        &["sweep", "-m", "1..100", "--format", "csv"],
        &["viz", "-p", "16", "-m", "64", "--columns", "5000"],
    ];
    for args in big {
        // The reader goes away at once: the write fails with a broken pipe.
        let mut child = Command::new(env!("CARGO_BIN_EXE_pipewright"))
            .current_dir(d)
            .args(*args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_pipewright"))
            .current_dir(d)
            .args(*args)
            .stdout(full)
            .output()
            .unwrap();
        common::refusal(&o, args, Some(1), &["cannot write to standard output"]);
    }
    // A terminal chart of any width draws without a panic; a width no terminal has is
    // refused by name.
    let out = ok(d, &["viz", "--columns", "60000", "-p", "2", "-m", "2"]);
    assert!(out.lines().all(|l| l.chars().count() <= 60000));
    refused(d, &["viz", "--columns", "70000"], &["--columns 70000"]);
    refused(d, &["viz", "--columns", "0"], &["--columns 0"]);
}

/// How a test spells a path to the file `x.json` in its folder.
#[derive(Clone, Copy, Debug)]
enum Spelling {
    Plain,
    Dotted,
    UpAndBack,
    Symlink,
    HardLink,
    Absolute,
}

fn spell(dir: &Path, how: Spelling) -> String {
    match how {
        Spelling::Plain => "x.json".into(),
        Spelling::Dotted => "./x.json".into(),
        Spelling::UpAndBack => "sub/../x.json".into(),
        Spelling::Symlink => "sym.json".into(),
        Spelling::HardLink => "hard.json".into(),
        Spelling::Absolute => dir.join("x.json").display().to_string(),
    }
}

fn spelling() -> impl Strategy<Value = Spelling> {
    prop_oneof![
        Just(Spelling::Plain),
        Just(Spelling::Dotted),
        Just(Spelling::UpAndBack),
        Just(Spelling::Symlink),
        Just(Spelling::HardLink),
        Just(Spelling::Absolute),
    ]
}

/// Commands with a JSON input flag and a JSON output flag, and what the input must hold.
const PAIRS: &[(&str, &str, &str, &[&str])] = &[
    ("simulate", "--timetable", "--timeline", &[]),
    ("simulate", "--cost-file", "--trace", &[]),
    ("bench", "--timetable", "--trace", &["--steps", "1"]),
    ("bench", "--cost-file", "--costs-out", &["--steps", "1"]),
    ("train", "--timetable", "--trace", &["--steps", "1"]),
    (
        "search",
        "--cost-file",
        "--timetable-out",
        &["--memory-cap", "4"],
    ),
    ("viz", "--from", "-o", &[]),
    ("simulate", "--hf-config", "--timeline", &[]),
    (
        "search",
        "--hf-config",
        "--timetable-out",
        &["--memory-cap", "4"],
    ),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// However the two paths are spelled, an output never lands on an input: the run is
    /// refused and the input keeps its bytes.
    #[test]
    fn an_output_never_lands_on_an_input(
        which in 0..PAIRS.len(),
        input in spelling(),
        output in spelling(),
    ) {
        let d = tempfile::tempdir().unwrap();
        let d = d.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        let (cmd, in_flag, out_flag, extra) = PAIRS[which];
        let content = "{\"default\": {\"f\": 1, \"b\": 2}}";
        std::fs::write(d.join("x.json"), content).unwrap();
        std::os::unix::fs::symlink("x.json", d.join("sym.json")).unwrap();
        std::fs::hard_link(d.join("x.json"), d.join("hard.json")).unwrap();
        let (i, mut o) = (spell(d, input), spell(d, output));
        if out_flag == "-o" {
            // viz draws images: the same file under an image name, through a link.
            std::os::unix::fs::symlink("x.json", d.join("x.svg")).unwrap();
            o = "x.svg".into();
        }
        let mut args = vec![cmd, in_flag, &i, out_flag, &o];
        args.extend_from_slice(extra);
        let out = common::run_in(Some(d), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        prop_assert!(!out.status.success(), "{args:?} succeeded");
        prop_assert!(err.contains("destroy"), "{args:?}: {err}");
        prop_assert_eq!(std::fs::read_to_string(d.join("x.json")).unwrap(), content);
    }
}
