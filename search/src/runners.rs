//! What the search may hand back, and what it keeps beside the best: a timetable the runtime
//! the costs describe cannot run (or that splits the backward when told not to) is refused;
//! the next fitting candidates are made again for a measured tuning step.

use super::{build, key, Best, Candidate, Job, SearchSpec, Shape};
use pipewright_schedule::action::ActionKind;
use pipewright_schedule::timetable::Timetable;
use pipewright_sim::simulate::Runtime;

/// Why the search may not hand back `tt`: it splits the backward when told not to, or
/// recomputes for a runtime that cannot (PyTorch's has no `R` action).
pub(super) fn refused(tt: &Timetable, spec: &SearchSpec) -> Option<&'static str> {
    let kinds = || tt.devices.iter().flatten().map(|a| a.kind);
    if !spec.split_backward && kinds().any(|k| matches!(k, ActionKind::I | ActionKind::W)) {
        return Some("it splits the backward, and the search was told not to (no split backward)");
    }
    let pytorch = spec
        .costs
        .host
        .is_some_and(|h| h.runtime == Runtime::Pytorch);
    if pytorch && kinds().any(|k| k == ActionKind::R) {
        return Some("it recomputes, and PyTorch's runtime (the costs' host.runtime) has no recompute action");
    }
    None
}

/// The fitting candidates after the best, fastest first, with their timetables made again
/// (making one is cheap beside simulating it, and only the best is kept while searching).
pub(super) fn runners_up(
    spec: &SearchSpec,
    jobs: &[Job],
    shapes: &[Option<Shape>],
    candidates: &[Candidate],
    made_by: &[usize],
    best: &Best,
) -> Vec<(usize, Timetable)> {
    // Not the best's own job: when gap filling improved the best, its base is a near copy.
    let mut order: Vec<usize> = (0..made_by.len())
        .filter(|&c| candidates[c].fits && made_by[c] != best.job)
        .collect();
    order.sort_by_key(|&c| key(&candidates[c], spec.objective));
    let mut out: Vec<(usize, Timetable)> = Vec::new();
    for c in order {
        if out.len() >= spec.runners_up {
            break;
        }
        let Ok((_, _, tt)) = build(&jobs[made_by[c]], spec, shapes, None) else {
            continue;
        };
        if tt.devices != best.timetable.devices && out.iter().all(|(_, t)| t.devices != tt.devices)
        {
            out.push((c, tt));
        }
    }
    out
}
