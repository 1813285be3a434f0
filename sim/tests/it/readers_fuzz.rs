//! The readers never panic: arbitrary bytes and mutated valid files fed to the CSV and JSON
//! readers give a value or an error, and whatever they accept validates, simulates and
//! summarises without panicking either.

use pipewright_schedule::Checked;
use pipewright_schedule::{
    from_csv, generate, to_csv, validate, ScheduleKind, ScheduleSpec, Timeline, Timetable,
};
use pipewright_sim::{simulate, CostModel, Report, StageCost};
use proptest::prelude::*;

/// Everything downstream of a timetable the readers accepted.
fn use_timetable(tt: &Timetable) {
    if validate(tt).is_ok() && tt.len() < 100_000 {
        let model = CostModel::uniform(tt.num_stages(), StageCost::new(1.0, 2.0, None).unwrap());
        let _ = simulate(&Checked::new(tt.clone()).unwrap(), &model);
    }
}

fn feed(text: &str) {
    if let Ok((tt, src)) = from_csv(text) {
        use_timetable(&tt);
        let _ = src.line_col(0, 0);
    }
    if let Ok(tt) = serde_json::from_str::<Timetable>(text) {
        use_timetable(&tt);
    }
    if let Ok(tl) = serde_json::from_str::<Timeline>(text) {
        if tl.meta.devices < 10_000 && tl.meta.stages < 10_000 {
            let model = CostModel::uniform(tl.meta.stages, StageCost::new(1.0, 2.0, None).unwrap());
            let _ = Report::new(&tl, &model);
        }
    }
    for stages in [1, 4] {
        let _ = CostModel::from_json(text, stages);
    }
}

/// Valid files of every kind: a CSV and a JSON timetable, a timeline, a cost file.
fn valid_files() -> Vec<String> {
    let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 2, 2, 4, None).unwrap();
    let tt = generate(&spec);
    let model = CostModel::uniform(tt.num_stages(), StageCost::new(1.0, 2.0, None).unwrap());
    let sim = simulate(&Checked::new(tt.clone()).unwrap(), &model).unwrap();
    vec![
        to_csv(&tt),
        serde_json::to_string(&tt).unwrap(),
        serde_json::to_string(&sim.timeline).unwrap(),
        r#"{"default": {"f": 1, "b": 2, "w": 1, "activation_bytes": 64}, "stages": [{}, {"f": 2}], "p2p_latency": 0.1}"#.to_string(),
    ]
}

/// Mutations of a file: bytes replaced, inserted or removed at positions.
fn mutations() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), 0u8..3, any::<u8>()), 1..8)
}

fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, op, b) in edits {
        let i = at % (bytes.len() + 1);
        match op {
            0 if i < bytes.len() => bytes[i] = b,
            1 => bytes.insert(i, b),
            _ if i < bytes.len() => {
                bytes.remove(i);
            }
            _ => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        feed(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn csv_like_text_never_panics(text in "[0-9FBIWSENDRCV_,;() \n\r\u{feff}-]{0,80}") {
        feed(&text);
    }

    #[test]
    fn mutated_valid_files_never_panic(which in 0usize..4, edits in mutations()) {
        let file = valid_files().swap_remove(which);
        feed(&String::from_utf8_lossy(&mutate(file.into_bytes(), &edits)));
    }
}
