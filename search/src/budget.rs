//! Bounding a search: the order jobs are evaluated in (what is cheap and likely good first),
//! a time budget after which the best found so far is returned, and progress reports.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::Job;
use pipewright_schedule::cancel::Cancel;
use pipewright_schedule::spec::ScheduleKind;

/// How far a search has got, reported after every evaluated candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Candidates evaluated so far.
    pub done: usize,
    /// Candidates to evaluate in all.
    pub total: usize,
    /// The objective of the best fitting candidate so far.
    pub best: Option<f64>,
    /// Its label.
    pub best_label: Option<String>,
}

/// A search the time budget stopped before every candidate was evaluated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CutShort {
    /// The budget, in seconds.
    pub budget_seconds: f64,
    /// Candidates evaluated (the best is the best of these).
    pub evaluated: usize,
    /// Candidates there were to evaluate.
    pub total: usize,
}

/// Longest time budget a search takes, in seconds (`search --time-budget`, Python's
/// `time_budget=`): a bound on every call, which Ctrl-C can cut shorter. An hour: the largest
/// searches BENCHMARKS.md times take under a minute, and a budget past what a person waits
/// for at a prompt is a mistake (a figure in ms, say), not a wish.
pub const MAX_TIME_BUDGET: f64 = 3600.0;

/// When a search must stop: its time budget spent, or its [`Cancel`] flag set.
#[derive(Clone, Debug)]
pub(super) struct Deadline(Option<Instant>, Cancel);

impl Deadline {
    pub(super) fn after(budget: Option<Duration>, cancel: &Cancel) -> Self {
        Deadline(budget.map(|b| Instant::now() + b), cancel.clone())
    }

    pub(super) fn passed(&self) -> bool {
        self.1.is_cancelled() || self.0.is_some_and(|d| Instant::now() >= d)
    }
}

/// Evaluation order of a job, lowest first: the families with one shape per `v`, then
/// interleaving at group sizes that are multiples of `p` (and `m`), then the list scheduler
/// and the zero-bubble rounds heuristic, then the other group sizes. A budget that runs out cuts the last, least likely to win.
pub(super) fn priority(job: &Job, p: u32, m: u32) -> u8 {
    match job {
        Job::Fixed(s) if s.kind() != ScheduleKind::Interleaved1F1B || s.virtual_stages() == 1 => 0,
        Job::Fixed(s) if s.group_size() % p.max(1) == 0 || s.group_size() == m => 1,
        Job::List(_) | Job::Rounds(..) | Job::Recompute(..) => 2,
        Job::Fixed(_) => 3,
    }
}

/// Job indices in evaluation order (stable within a priority).
pub(super) fn order(jobs: &[Job], p: u32, m: u32) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..jobs.len()).collect();
    idx.sort_by_key(|&i| priority(&jobs[i], p, m));
    idx
}
