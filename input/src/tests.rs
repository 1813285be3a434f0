use super::*;
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
use pipewright_sim::{simulate, CostModel};

fn timeline_json() -> serde_json::Value {
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 3, None).unwrap();
    let sim = simulate(
        &Checked::new(generate(&spec)).unwrap(),
        &CostModel::uniform(2, pipewright_sim::StageCost::new(1.0, 2.0, None).unwrap()),
    )
    .unwrap();
    serde_json::to_value(&sim.timeline).unwrap()
}

#[test]
fn a_written_timeline_reads_back_and_a_corrupt_one_is_refused_in_the_checks_words() {
    let good = timeline_json();
    let tl = timeline_from_text("t.json", &good.to_string()).unwrap();
    assert_eq!(tl.meta.devices, 2);
    let mut bad = good.clone();
    bad["events"][0]["action"]["stage"] = serde_json::json!(5);
    let e = timeline_from_text("t.json", &bad.to_string()).unwrap_err();
    assert!(e.to_string().starts_with("t.json: event 0 "), "{e}");
    assert!(e.to_string().contains("stage 5 does not exist"), "{e}");
    let mut empty = good;
    empty["events"] = serde_json::json!([]);
    let e = timeline_from_text("t.json", &empty.to_string()).unwrap_err();
    assert_eq!(e.to_string(), "t.json: the timeline has no events");
}

#[test]
fn json_of_another_kind_is_named_for_what_it_is() {
    let e = timeline_from_text("c.json", r#"{"default": {"f": 1, "b": 2}}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "c.json is a cost file (give it as --cost-file), not a timeline"
    );
    let e = timeline_from_text("x.json", r#"{"meta": 3}"#).unwrap_err();
    assert!(
        e.to_string().starts_with("x.json is not a timeline JSON: "),
        "{e}"
    );
}

#[test]
fn texts_past_the_limit_or_this_machine_are_refused_before_parsing() {
    let e = text_fits("big.json", MAX_INPUT + 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "big.json is 1.00 GiB, more than the 1.00 GiB pipewright reads"
    );
    let e = fits("reading huge.json", u64::MAX).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "reading huge.json needs about 16.00 EiB of memory, more than this machine's"
        ),
        "{e}"
    );
}

#[test]
fn files_are_text_files_or_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let e = read_text(d.path()).unwrap_err();
    assert!(e.to_string().ends_with("is a folder, not a file"), "{e}");
    let bin = d.path().join("b.json");
    std::fs::write(&bin, [b'{', 0xff, b'}']).unwrap();
    let e = read_text(&bin).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("b.json is not a text file (not UTF-8 at byte 1)"),
        "{e}"
    );
    let bom = d.path().join("bom.json");
    std::fs::write(&bom, "\u{feff}{}").unwrap();
    assert_eq!(read_text(&bom).unwrap(), "{}");
    let e = read_text(&d.path().join("none.json")).unwrap_err();
    assert!(e.to_string().starts_with("cannot read "), "{e}");
    #[cfg(unix)]
    {
        let e = read_text(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "/dev/zero is a device, not a file");
    }
}

#[test]
fn a_timetable_past_this_machine_is_refused_with_its_figure() {
    assert!(timetable_fits("p=2 v=1 m=4", 8, 1).is_ok());
    let e = timetable_fits("search p=64", u64::MAX / 4, 2)
        .unwrap_err()
        .to_string();
    let want = format!(
        "search p=64 ({} stage-microbatches x 2) needs about ",
        u64::MAX / 4
    );
    assert!(e.starts_with(&want), "{e}");
    assert!(e.contains("of memory, more than this machine's"), "{e}");
}
