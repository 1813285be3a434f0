//! The shapes a search evaluates: every fixed family over its `v` and group sizes, those over
//! the cap again with recomputation, and the list scheduler over placements, priorities and
//! caps.

use super::list::fmt_units;
use super::{
    generate, peak_units_held, Job, Knobs, Placement, RoundKnobs, Runtime, ScheduleKind,
    ScheduleSpec, SearchSpec, Shape, Skipped,
};

/// Every shape to try, and those that cannot be tried.
pub(super) fn jobs(
    spec: &SearchSpec,
    cap: f64,
    shapes: &[Option<Shape>],
) -> (Vec<Job>, Vec<Skipped>) {
    let (p, m) = (spec.devices, spec.microbatches);
    let mut jobs = Vec::new();
    let mut skipped = Vec::new();
    for &kind in &spec.families {
        if !spec.split_backward && splits(kind) {
            skipped.push(Skipped {
                label: kind.name().to_string(),
                reason: "it splits the backward, and the search was told not to".into(),
            });
            continue;
        }
        for (v, g) in family_shapes(kind, p, m, spec.max_virtual) {
            if v > spec.max_virtual.max(1) {
                skipped.push(Skipped {
                    label: fixed_label(kind, v, g),
                    reason: format!(
                        "v={v} is above the largest v allowed ({})",
                        spec.max_virtual
                    ),
                });
                continue;
            }
            match ScheduleSpec::new(kind, p, v, m, g) {
                Ok(s) if shapes[v as usize].is_some() => jobs.push(Job::Fixed(s)),
                Ok(_) => skipped.push(Skipped {
                    label: fixed_label(kind, v, g),
                    reason: resample_reason(spec, p * v),
                }),
                Err(e) => skipped.push(Skipped {
                    label: fixed_label(kind, v, g),
                    reason: e.to_string(),
                }),
            }
        }
    }
    let pytorch = spec
        .costs
        .host
        .is_some_and(|h| h.runtime == Runtime::Pytorch);
    if !pytorch {
        jobs.extend(recompute_jobs(&jobs, spec, cap, shapes));
    }
    if spec.list_scheduler {
        list_jobs(spec, cap, shapes, &mut jobs, &mut skipped);
    }
    (jobs, skipped)
}

/// Whether a family's timetables split the backward into I and W.
fn splits(kind: ScheduleKind) -> bool {
    use ScheduleKind::*;
    matches!(kind, ZbH1 | ZbH2 | Zbv | DualPipeV)
}

/// The fixed shapes over the cap, to try again with recomputation where a stage can shrink.
/// Only costs that say what a recomputed microbatch keeps (hand-off sizes or `kept_bytes`)
/// are tried: without them a recompute would look free of memory.
fn recompute_jobs(
    fixed: &[Job],
    spec: &SearchSpec,
    cap: f64,
    shapes: &[Option<Shape>],
) -> Vec<Job> {
    let sizes = spec.costs.stages.iter();
    if !sizes
        .clone()
        .any(|c| c.kept_bytes.is_some() || c.p2p_bytes > 0)
    {
        return Vec::new();
    }
    let over = |s: &ScheduleSpec| {
        let Some(shape) = &shapes[s.virtual_stages() as usize] else {
            return false;
        };
        let shrinks = shape.kept.iter().zip(&shape.weights).any(|(k, w)| k < w);
        let peak = peak_units_held(&generate(s), &shape.weights, &shape.held);
        shrinks && peak.into_iter().any(|x| x > cap + 1e-9)
    };
    fixed
        .iter()
        .filter_map(|j| match j {
            Job::Fixed(s) if over(s) => Some(Job::Recompute(*s, cap)),
            _ => None,
        })
        .collect()
}

fn resample_reason(spec: &SearchSpec, stages: u32) -> String {
    match spec.costs.resample(stages) {
        Err(e) => e.to_string(),
        Ok(_) => "no costs".to_string(),
    }
}

/// Above this many, interleaving group sizes are tried at powers of two only.
const MAX_GROUP_SIZES: u32 = 256;

/// The (v, group size) shapes of a family.
fn family_shapes(kind: ScheduleKind, p: u32, m: u32, max_v: u32) -> Vec<(u32, Option<u32>)> {
    if let Some(v) = kind.fixed_virtual() {
        return vec![(v, None)];
    }
    if !kind.supports_virtual() {
        return vec![(1, None)];
    }
    let mut out = Vec::new();
    for v in 2..=max_v {
        if kind != ScheduleKind::Interleaved1F1B {
            out.push((v, None));
            continue;
        }
        // Every group size from p to m (m is one group) when there are few, so no fixed
        // interleaving beats the search; else p, 2p, 4p, ... and m.
        let p = p.max(1);
        if m.saturating_sub(p) <= MAX_GROUP_SIZES {
            out.extend((p..=m.max(p)).map(|g| (v, Some(g))));
        } else {
            let mut g = p;
            while g < m {
                out.push((v, Some(g)));
                g = g.saturating_mul(2);
            }
            out.push((v, Some(m)));
        }
    }
    out
}

pub(super) fn fixed_label(kind: ScheduleKind, v: u32, g: Option<u32>) -> String {
    let mut label = kind.name().to_string();
    if v > 1 && kind.supports_virtual() {
        label += &format!(" v={v}");
    }
    if let Some(g) = g {
        label += &format!(" g={g}");
    }
    label
}

/// The list scheduler's shapes: every placement with every priority at the full cap, and the
/// default priorities at smaller caps (the points of the Pareto front).
fn list_jobs(
    spec: &SearchSpec,
    cap: f64,
    shapes: &[Option<Shape>],
    jobs: &mut Vec<Job>,
    skipped: &mut Vec<Skipped>,
) {
    let p = spec.devices;
    for (v, placement) in list_placements(spec.max_virtual) {
        let knobs = Knobs {
            v,
            placement,
            split: spec.split_backward,
            backward_first: true,
            depth_first: true,
            cap,
            lookahead: false,
            w_in_gaps: false,
        };
        let Some(shape) = &shapes[v as usize] else {
            skipped.push(Skipped {
                label: knobs.label(),
                reason: resample_reason(spec, p * v),
            });
            continue;
        };
        let need = passage_need(p, v, placement, &shape.weights);
        if need > cap + 1e-9 {
            skipped.push(Skipped {
                label: knobs.label(),
                reason: format!(
                    "one microbatch needs {} units on a device and the cap is {}",
                    fmt_units(need),
                    fmt_units(cap)
                ),
            });
            continue;
        }
        let splits: &[bool] = if spec.split_backward {
            &[true, false]
        } else {
            &[false]
        };
        for &split in splits {
            for backward_first in [true, false] {
                for depth_first in [true, false] {
                    if v == 1 && !depth_first {
                        continue; // one chunk per device: no depth to prefer
                    }
                    jobs.push(Job::List(Knobs {
                        split,
                        backward_first,
                        depth_first,
                        ..knobs
                    }));
                }
            }
        }
        for (lookahead, w_in_gaps) in [(true, false), (false, true), (true, true)] {
            if spec.split_backward || !w_in_gaps {
                jobs.push(Job::List(Knobs {
                    lookahead,
                    w_in_gaps,
                    ..knobs
                }));
            }
        }
        if v == 1 && spec.split_backward {
            jobs.extend(RoundKnobs::ALL.iter().map(|&k| Job::Rounds(k, cap)));
        }
        for level in cap_levels(need, cap) {
            jobs.push(Job::List(Knobs {
                cap: level,
                ..knobs
            }));
        }
    }
}

/// The list scheduler's placements: loop with v = 1..=max_v, and the V when v = 2 is allowed.
pub(super) fn list_placements(max_v: u32) -> Vec<(u32, Placement)> {
    let mut placements: Vec<(u32, Placement)> =
        (1..=max_v.max(1)).map(|v| (v, Placement::Loop)).collect();
    if max_v >= 2 {
        placements.push((2, Placement::V));
    }
    placements
}

/// Units the neediest device must hold to pass one microbatch through all its chunks.
pub(super) fn passage_need(p: u32, v: u32, placement: Placement, weights: &[f64]) -> f64 {
    let mut need = vec![0.0; p as usize];
    for (s, w) in weights.iter().enumerate() {
        need[placement.device_of(s as u32, p) as usize] += w;
    }
    debug_assert_eq!(weights.len() as u32, p * v);
    need.into_iter().fold(0.0, f64::max)
}

/// Caps below `cap` worth trying: 1, 1.5, 2, 3, 4, 6, ... times `need`.
fn cap_levels(need: f64, cap: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut base = need.max(1e-9);
    while base < cap - 1e-9 {
        out.push(base);
        if base * 1.5 < cap - 1e-9 {
            out.push(base * 1.5);
        }
        base *= 2.0;
    }
    out
}
