//! `search` under a whole-rank byte cap: with a memory model, a candidate fits when every
//! device's predicted total (parameters, gradients, optimizer state, activations) does.

use pipewright_model::memory::{predict, Accounting, MemoryConfig, ModelShape};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
use pipewright_search::{search, MemoryCap, SearchError, SearchSpec};
use pipewright_sim::{CostModel, StageCost};

const P: u32 = 4;
const M: u32 = 8;

fn memory() -> MemoryConfig {
    let shape = ModelShape::gpt(8, 256, 8, 1024, 128, 1024);
    MemoryConfig {
        microbatch_size: 2,
        ..MemoryConfig::new(shape, P).with_accounting(Accounting::Pipewright)
    }
}

fn spec(cap: u64) -> SearchSpec {
    let costs = CostModel::uniform(P, StageCost::new(1.0, 2.0, Some(1.0)).unwrap());
    let mut s = SearchSpec::new(P, M, costs, MemoryCap::Bytes(cap));
    s.memory = Some(memory());
    s.max_virtual = 2;
    s.improve_budget = 0;
    s
}

fn total(kind: ScheduleKind) -> u64 {
    let tt = generate(&ScheduleSpec::new(kind, P, 1, M, None).unwrap());
    let per_device = predict(&memory(), &tt).unwrap();
    per_device.iter().map(|m| m.total()).max().unwrap()
}

#[test]
fn the_cap_bounds_each_rank_s_whole_predicted_memory() {
    // Between 1F1B's whole-rank need and GPipe's: GPipe's m stashes break the cap.
    let (one, gpipe) = (total(ScheduleKind::OneFOneB), total(ScheduleKind::GPipe));
    assert!(one < gpipe);
    let cap = (one + gpipe) / 2;
    let found = search(&spec(cap)).unwrap();
    let best = &found.candidates[found.best];
    assert!(
        best.fits && best.peak_bytes.is_some_and(|b| b <= cap),
        "{best:?}"
    );
    let v = found.timetable.num_stages() / P;
    let cfg = MemoryConfig { v, ..memory() };
    let predicted = predict(&cfg, &found.timetable).unwrap();
    assert_eq!(predicted.iter().map(|m| m.total()).max(), best.peak_bytes);
    // Parameters and optimizer state count: the activations alone would fit far more.
    assert!(predicted
        .iter()
        .all(|m| m.parameters > 0 && m.optimizer_state > 0));
    let gp = found.candidates.iter().find(|c| c.label == "gpipe");
    assert!(
        gp.is_some_and(|c| !c.fits && c.peak_bytes == Some(gpipe)),
        "{gp:?}"
    );
}

#[test]
fn a_cap_under_the_weights_alone_is_refused_saying_so() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, P, 1, M, None).unwrap());
    let fixed = predict(&memory(), &tt).unwrap();
    let weights = fixed
        .iter()
        .map(|m| m.parameters + m.gradients + m.optimizer_state)
        .max()
        .unwrap();
    let e = search(&spec(weights)).unwrap_err();
    assert!(
        matches!(e, SearchError::StaticOverCap { need, .. } if need == weights),
        "{e}"
    );
    assert!(
        e.to_string().contains("leaves nothing for activations"),
        "{e}"
    );
}
