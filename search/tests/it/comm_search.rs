//! The search weighs communication inside actions (`f_comm`, `b_comm`): DualPipeV's overlaps
//! hide expert parallelism's all-to-all, so it wins where that is heavy.
use pipewright_search::{search, MemoryCap, SearchSpec};
use pipewright_sim::{CostModel, StageCost};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn search_picks_dualpipev_when_its_overlaps_hide_all_to_all() {
    // 4 devices, 16 microbatches, f = 1, b = 2, no memory limit. Dense, a schedule without
    // overlaps wins; with all-to-all of 0.5 in F and 1 in B, DualPipeV's overlaps hide it and
    // it wins (58.5 against 85.5 for 1F1B, which pays it all).
    let best = |fm: f64, bm: f64| {
        let c = StageCost {
            f_comm: fm,
            b_comm: bm,
            activation_bytes: 1,
            ..StageCost::new(1.0, 2.0, None).unwrap()
        };
        let cap = MemoryCap::Microbatches(100.0);
        let found = search(&SearchSpec::new(4, 16, CostModel::uniform(4, c), cap)).unwrap();
        let best = found.candidates[found.best].clone();
        (best, found.simulation.report)
    };
    let (dense, _) = best(0.0, 0.0);
    assert!(!dense.family.starts_with("dualpipev"), "{}", dense.label);
    let (moe, report) = best(0.5, 1.0);
    assert!(moe.family.starts_with("dualpipev"), "{}", moe.label);
    assert!(close(moe.makespan, 58.5), "{}", moe.makespan);
    assert!(report.comm_hidden > 0.0);
}
