//! A search with a time budget: a budget too small for every candidate returns a valid,
//! fitting best, says it was cut short, and reports its progress; one large enough changes
//! nothing.

use std::time::Duration;

use pipewright_schedule::validate;
use pipewright_search::{search, search_with, MemoryCap, SearchSpec};
use pipewright_sim::{CostModel, StageCost};

fn spec(budget: Option<Duration>) -> SearchSpec {
    let costs = CostModel::uniform(4, StageCost::new(1.0, 2.0, Some(1.0)).unwrap());
    let mut s = SearchSpec::new(4, 12, costs, MemoryCap::Microbatches(4.0));
    s.time_budget = budget;
    s
}

#[test]
fn a_tiny_budget_returns_a_valid_fitting_best_and_says_it_was_cut_short() {
    let mut reports = Vec::new();
    let found = search_with(&spec(Some(Duration::ZERO)), &mut |p| {
        reports.push(p.clone())
    })
    .expect("a budget never turns a search that fits into an error");
    let cut = found
        .cut_short
        .as_ref()
        .expect("a zero budget cuts the search short");
    assert!(cut.evaluated >= 1 && cut.evaluated < cut.total, "{cut:?}");
    assert_eq!(found.candidates.len(), cut.evaluated);
    let best = &found.candidates[found.best];
    assert!(best.fits && best.peak_microbatches <= 4.0, "{best:?}");
    validate(&found.timetable).expect("the best so far is a valid timetable");
    // One report per evaluated candidate, counting up to where the budget stopped.
    assert_eq!(reports.len(), cut.evaluated);
    assert!(reports
        .iter()
        .enumerate()
        .all(|(i, p)| p.done == i + 1 && p.total == cut.total));
    assert!(reports.last().unwrap().best.is_some());
}

#[test]
fn an_ample_budget_evaluates_everything_and_finds_what_no_budget_finds() {
    let free = search(&spec(None)).unwrap();
    let ample = search(&spec(Some(Duration::from_secs(3600)))).unwrap();
    assert!(free.cut_short.is_none() && ample.cut_short.is_none());
    assert_eq!(free.candidates.len(), ample.candidates.len());
    let (a, b) = (&free.candidates[free.best], &ample.candidates[ample.best]);
    assert_eq!((&a.label, a.period), (&b.label, b.period));
}

#[test]
fn a_cancelled_search_stops_at_its_next_candidate_and_a_cancelled_sweep_at_its_next_row() {
    // Set from another thread mid-search (Ctrl-C in Python): the search returns what it has.
    let s = spec(None);
    let flag = s.cancel.clone();
    let found = search_with(&s, &mut |p| {
        if p.done == 2 {
            flag.cancel();
        }
    })
    .unwrap();
    let cut = found
        .cut_short
        .expect("a cancelled search says it was cut short");
    assert_eq!(cut.evaluated, 2, "{cut:?}");

    let grid = pipewright_search::SweepGrid {
        schedules: vec![pipewright_schedule::ScheduleKind::OneFOneB],
        devices: 4,
        virtual_stages: vec![1],
        microbatches: vec![4, 8, 16],
        memory_cap: None,
    };
    let costs = |stages, _| {
        Ok(CostModel::uniform(
            stages,
            StageCost::new(1.0, 2.0, None).unwrap(),
        ))
    };
    let cancel = pipewright_schedule::Cancel::default();
    assert_eq!(
        pipewright_search::sweep::sweep_until(&grid, costs, &cancel).len(),
        3
    );
    cancel.cancel();
    assert!(pipewright_search::sweep::sweep_until(&grid, costs, &cancel).is_empty());
}
