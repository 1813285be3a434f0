use super::*;

fn out<'a>(flag: &'static str, p: &'a Path, kind: Kind) -> Option<Output<'a>> {
    Some(Output {
        flag,
        path: p,
        kind,
    })
}

fn input<'a>(flag: &'static str, p: &'a Path) -> Option<Input<'a>> {
    Some(Input { flag, path: p })
}

fn plan_err(inputs: Vec<Option<Input>>, outputs: Vec<Option<Output>>) -> String {
    match Outputs::plan(inputs, outputs) {
        Ok(_) => panic!("planned"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn outputs_are_refused_before_work_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("c.png");
    let same = dir.path().join(".").join("c.png");
    let e = plan_err(
        vec![],
        vec![
            out("--trace", &png, Kind::Image),
            out("--chart", &same, Kind::Image),
        ],
    );
    assert!(e.starts_with("--trace and --chart both name"), "{e}");
    let e = plan_err(
        vec![],
        vec![out("--chart", Path::new("nodir/c.png"), Kind::Image)],
    );
    assert!(e.contains("folder nodir does not exist"), "{e}");
    let e = plan_err(vec![], vec![out("--trace", &png, Kind::Json)]);
    assert!(e.contains("use a .json file name"), "{e}");
    let e = plan_err(vec![], vec![out("-o", dir.path(), Kind::Image)]);
    assert!(e.contains("use a .svg or .png"), "{e}");
    Outputs::plan([], [out("--chart", &png, Kind::Image), None]).unwrap();
}

#[test]
fn an_output_that_is_an_input_is_refused_however_it_is_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tt = d.join("x.json");
    std::fs::write(&tt, "{}").unwrap();
    let dotted = d.join(".").join("x.json");
    let e = plan_err(
        vec![input("--timetable", &tt)],
        vec![out("--timeline", &dotted, Kind::Json)],
    );
    assert!(
        e.contains("--timeline") && e.contains("--timetable") && e.contains("destroy"),
        "{e}"
    );
    #[cfg(unix)]
    {
        let link = d.join("link.json");
        std::os::unix::fs::symlink(&tt, &link).unwrap();
        let e = plan_err(
            vec![input("--timetable", &link)],
            vec![out("--trace", &tt, Kind::Json)],
        );
        assert!(e.contains("--trace"), "{e}");
        let hard = d.join("hard.json");
        std::fs::hard_link(&tt, &hard).unwrap();
        let e = plan_err(
            vec![input("--cost-file", &tt)],
            vec![out("--costs-out", &hard, Kind::Json)],
        );
        assert!(
            e.contains("--costs-out") && e.contains("--cost-file"),
            "{e}"
        );
    }
    assert_eq!(std::fs::read_to_string(&tt).unwrap(), "{}");
}

#[test]
fn staged_outputs_change_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, b) = (d.join("a.json"), d.join("b.json"));
    std::fs::write(&a, "old a").unwrap();
    // Staged but dropped before the commit: nothing changes, nothing is left behind.
    let mut outs =
        Outputs::plan([], [out("--a", &a, Kind::Json), out("--b", &b, Kind::Json)]).unwrap();
    outs.stage("--a", b"new a").unwrap();
    drop(outs);
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 1);
    // A rename that fails (b became a folder) puts a back.
    let mut outs =
        Outputs::plan([], [out("--a", &a, Kind::Json), out("--b", &b, Kind::Json)]).unwrap();
    outs.stage("--a", b"new a").unwrap();
    outs.stage("--b", b"new b").unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(b.join("keep"), "x").unwrap();
    let e = outs.commit().unwrap_err().to_string();
    assert!(
        e.contains("--b") && e.contains("no output was changed"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 2, "a leftover file");
    std::fs::remove_dir_all(&b).unwrap();
    let mut outs =
        Outputs::plan([], [out("--a", &a, Kind::Json), out("--b", &b, Kind::Json)]).unwrap();
    outs.stage("--a", b"new a").unwrap();
    outs.stage("--b", b"new b").unwrap();
    outs.commit().unwrap();
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "new a");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "new b");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 2);
}
