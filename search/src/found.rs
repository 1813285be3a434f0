//! After the evaluation: the candidates sorted out, why there is no best when there is
//! none, and the best timetable's gaps filled.

use super::{
    budget, describe, evaluate, fmt_units, improve, key, list_placements, passage_need, Best,
    Candidate, CutShort, Improve, Job, MemoryCap, Objective, SearchError, SearchSpec, Shape,
    Skipped,
};

/// The evaluated jobs sorted out: candidates in the order evaluated, the jobs that made
/// them, and where the best and the best fixed family are among them.
pub(super) struct Found {
    pub(super) candidates: Vec<Candidate>,
    pub(super) made_by: Vec<usize>,
    pub(super) skipped: Vec<Skipped>,
    pub(super) best_index: Option<usize>,
    pub(super) best_fixed: Option<usize>,
}

impl Found {
    pub(super) fn collect(
        evaluated: Vec<(usize, evaluate::Evaluated)>,
        jobs: &[Job],
        best: Option<&Best>,
        skipped: Vec<Skipped>,
        objective: Objective,
    ) -> Found {
        let mut found = Found {
            candidates: Vec::new(),
            made_by: Vec::new(),
            skipped,
            best_index: None,
            best_fixed: None,
        };
        for (i, result) in evaluated {
            let cand = match result {
                Err((label, reason)) => {
                    found.skipped.push(Skipped { label, reason });
                    continue;
                }
                Ok(cand) => cand,
            };
            let at = found.candidates.len();
            let better_fixed = found.best_fixed.map_or(true, |b| {
                key(&cand, objective) < key(&found.candidates[b], objective)
            });
            if cand.fits && matches!(jobs[i], Job::Fixed(_)) && better_fixed {
                found.best_fixed = Some(at);
            }
            if best.is_some_and(|b| b.job == i) {
                found.best_index = Some(at);
            }
            found.candidates.push(cand);
            found.made_by.push(i);
        }
        found
    }
}

/// Why there is no best: the time ran out, nothing could be built, or nothing fits.
pub(super) fn no_best(
    spec: &SearchSpec,
    found: &Found,
    cut_short: Option<CutShort>,
    shapes: &[Option<Shape>],
) -> SearchError {
    if let Some(cut) = cut_short {
        return SearchError::OutOfTime {
            budget_seconds: cut.budget_seconds,
            evaluated: cut.evaluated,
            total: cut.total,
            cap: spec.cap.to_string(),
        };
    }
    if found.candidates.is_empty() {
        if let Some(first) = found.skipped.first() {
            // Nothing was simulated at all: say why, not that nothing fits.
            return SearchError::NoCandidates(format!("{}: {}", first.label, first.reason));
        }
    }
    let passage = spec
        .list_scheduler
        .then(|| least_passage(spec.devices, spec.max_virtual, shapes))
        .flatten();
    nothing_fits(spec.cap, &found.candidates, &found.skipped, passage)
}

/// The last step: moving work into the best timetable's gaps.
pub(super) struct Polish<'a> {
    pub(super) spec: &'a SearchSpec,
    pub(super) shapes: &'a [Option<Shape>],
    pub(super) cap: f64,
    pub(super) unit: Option<f64>,
    pub(super) deadline: budget::Deadline,
}

impl Polish<'_> {
    /// Improve `best` (candidate `best_index`) by gap filling; a result that still fits is
    /// added as a candidate and becomes the best. Returns the best's index.
    pub(super) fn improve(
        self,
        best: &mut Best,
        jobs: &[Job],
        candidates: &mut Vec<Candidate>,
        best_index: usize,
    ) -> usize {
        let Some(shape) = &self.shapes[jobs[best.job].v() as usize] else {
            return best_index;
        };
        let how = Improve {
            costs: &shape.costs,
            weights: shape.weights(),
            cap: self.cap,
            budget: self.spec.improve_budget,
            objective: self.spec.objective,
            deadline: self.deadline,
        };
        let Some((tt, sim)) = improve(&best.timetable, &how) else {
            return best_index;
        };
        let base = &candidates[best_index];
        let label = format!("{} + gap filling", base.label);
        let what = (label, base.family.clone(), base.virtual_stages);
        let cand = describe(what, &tt, &sim, shape, self.unit, self.spec);
        if !cand.fits {
            return best_index;
        }
        candidates.push(cand);
        best.timetable = tt;
        best.simulation = sim.single;
        candidates.len() - 1
    }
}

/// The least memory any list schedule could run in: one microbatch at a time through the
/// placement whose neediest device needs the least.
fn least_passage(p: u32, max_v: u32, shapes: &[Option<Shape>]) -> Option<(f64, String)> {
    list_placements(max_v)
        .into_iter()
        .filter_map(|(v, place)| {
            let shape = shapes.get(v as usize)?.as_ref()?;
            let need = passage_need(p, v, place, &shape.weights);
            Some((
                need,
                format!("the list scheduler, one microbatch at a time, v={v}"),
            ))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

fn nothing_fits(
    cap: MemoryCap,
    candidates: &[Candidate],
    skipped: &[Skipped],
    passage: Option<(f64, String)>,
) -> SearchError {
    let least = candidates
        .iter()
        .map(|c| (c.peak_microbatches, c.label.clone()))
        .chain(passage)
        .min_by(|a, b| a.0.total_cmp(&b.0));
    match least {
        Some((units, label)) => SearchError::NothingFits {
            cap: cap.to_string(),
            least: fmt_units(units),
            label,
        },
        None => {
            SearchError::NoCandidates(skipped.first().map_or("no shapes to try".to_string(), |s| {
                format!("{}: {}", s.label, s.reason)
            }))
        }
    }
}
