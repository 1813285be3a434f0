//! All-to-all in the costs (`f_comm`, `b_comm`) from the command line: `simulate` says how
//! much DualPipeV's F&B overlaps hid, says nothing for dense costs, and refuses a bad value.

use crate::common;

#[test]
fn simulate_says_how_much_all_to_all_the_overlaps_hid() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("moe.json"),
        r#"{"default": {"f": 1, "b": 2, "f_comm": 0.5, "b_comm": 1}}"#,
    )
    .unwrap();
    let args = [
        "simulate",
        "--schedule",
        "dualpipev",
        "-p",
        "4",
        "-v",
        "2",
        "-m",
        "16",
    ];
    let moe = common::ok_in(Some(d), &[&args[..], &["--cost-file", "moe.json"]].concat());
    let line = moe
        .lines()
        .find(|l| l.starts_with("communication in actions"))
        .unwrap_or_else(|| panic!("no communication line:\n{moe}"));
    assert!(line.contains("hidden by F&B overlaps"), "{line}");
    let dense = common::ok_in(Some(d), &args);
    assert!(!dense.contains("communication"), "{dense}");
    // 1F1B hides none of it.
    let flat = common::ok_in(Some(d), &["simulate", "-p", "4", "--cost-file", "moe.json"]);
    assert!(
        flat.contains("hidden by F&B overlaps 0.000 (0.00%)"),
        "{flat}"
    );
}

#[test]
fn a_negative_all_to_all_time_is_refused_naming_the_stage_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("neg.json"),
        r#"{"default": {"f": 1, "b": 2, "f_comm": -1}}"#,
    )
    .unwrap();
    common::refused_in(
        Some(d),
        &["simulate", "--cost-file", "neg.json"],
        Some(1),
        &[
            "neg.json",
            "stage 0: f_comm must be a finite number >= 0 (got -1)",
        ],
    );
}
