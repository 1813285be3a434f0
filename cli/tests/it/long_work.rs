//! Long work is bounded and shows signs of life (issue 18, class 5), and oversubscribed runs
//! say so (class 7): piped training logs every N steps, a search stops at its time budget
//! with the best found so far and says so, and bad budgets are refused in one line.

use crate::common;

use common::{ok, run};

const TINY: [&str; 10] = [
    "--layers",
    "2",
    "-p",
    "2",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--seq-len",
    "8",
];

#[test]
fn piped_training_prints_a_log_line_every_n_steps() {
    let mut args = vec!["train", "--steps", "7", "--log-interval", "3"];
    args.extend(TINY);
    let out = ok(&args);
    let logged: Vec<&str> = out.lines().filter(|l| l.starts_with("step ")).collect();
    // Every 3 steps, and the last (the run is far under the 10 s floor).
    assert_eq!(logged.len(), 3, "{out}");
    for (line, step) in logged.iter().zip(["step 3/7:", "step 6/7:", "step 7/7:"]) {
        assert!(line.starts_with(step), "{line}");
        for part in ["loss ", "tokens/s", "step time ", " ms"] {
            assert!(line.contains(part), "{line} lacks {part}");
        }
    }
    let mut none = vec!["train", "--steps", "4", "--log-interval", "0"];
    none.extend(TINY);
    assert!(!ok(&none).lines().any(|l| l.starts_with("step ")));
}

#[test]
fn the_nan_check_can_be_turned_off() {
    let mut args = vec!["train", "--steps", "2", "--allow-non-finite"];
    args.extend(TINY);
    assert!(ok(&args).contains("2 steps"));
}

#[test]
fn a_search_out_of_time_returns_its_best_so_far_and_says_so() {
    let base = ["search", "-p", "8", "-m", "32", "--memory-cap", "8"];
    let mut args = base.to_vec();
    args.extend(["--time-budget", "0.001"]);
    let text = ok(&args);
    assert!(text.contains("cut short by the time budget"), "{text}");
    assert!(text.contains("best: "), "{text}");
    args.extend(["--format", "json"]);
    let json: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    let cut = &json["cut_short"];
    let (done, total) = (
        cut["evaluated"].as_u64().unwrap(),
        cut["total"].as_u64().unwrap(),
    );
    assert!(done >= 1 && done < total, "{cut}");
    assert_eq!(json["best"]["fits"], true);
    assert!(json["best"]["peak_microbatches"].as_f64().unwrap() <= 8.0);
    // An ample budget: nothing cut.
    let mut ample = base.to_vec();
    ample.extend(["--time-budget", "3600", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_str(&ok(&ample)).unwrap();
    assert!(json["cut_short"].is_null(), "{}", json["cut_short"]);
}

#[test]
fn bad_time_budgets_are_refused_in_one_line() {
    for b in ["0", "-1", "nan", "inf"] {
        let o = run(&["search", "--memory-cap", "4", "--time-budget", b]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{b}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--time-budget") && err.contains("above 0"),
            "{err}"
        );
    }
    // Every search is bounded: an hour at most (a figure in ms would be a mistake).
    let o = run(&["search", "--memory-cap", "4", "--time-budget", "1e6"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--time-budget") && err.contains("3600"),
        "{err}"
    );
}

#[test]
fn more_device_threads_than_cores_is_said_on_stderr_and_in_json() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let p = (cores + 1).to_string();
    let args = [
        "bench",
        "--schedule",
        "1f1b",
        "-p",
        &p,
        "-m",
        &p,
        "--cost",
        "0.05,0.1",
        "--steps",
        "2",
        "--format",
        "json",
    ];
    let o = run(&args);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let notes: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("oversubscribed"))
        .collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains(&format!("{p} device threads on {cores} cores")),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["threads"]["oversubscribed"], true, "{json}");
    // One thread per core or fewer: no note.
    let fit = [
        "bench",
        "--schedule",
        "1f1b",
        "-p",
        "1",
        "-m",
        "2",
        "--cost",
        "0.05,0.1",
        "--steps",
        "2",
    ];
    let o = run(&fit);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("oversubscribed"));
}

#[test]
fn a_40000_character_title_is_cut_to_the_chart_in_a_moment() {
    // Fitting cut one character at a time and re-measured the rest: a minute (issue 32).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    let title = "x".repeat(40_000);
    let started = std::time::Instant::now();
    ok(&[
        "viz",
        "--schedule",
        "1f1b",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--title",
        &title,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(
        svg.contains("x…<"),
        "the title ends in an ellipsis where it was cut"
    );
}
