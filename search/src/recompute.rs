//! Recomputation the search adds when a memory cap forces it, one microbatch at a time.
//!
//! Megatron and DeepSpeed recompute whole stages or every layer alike. A timetable says
//! exactly which stash is alive when a device peaks, so the search recomputes only those
//! microbatches: while a device is over the cap, the microbatch alive at its peak whose stash
//! would live longest (the earliest forward) keeps only its input until an `R` regrows the
//! rest right before its backward. An `R` needs nothing from other devices, so where the
//! backward waits for its gradient the recompute runs in that bubble for free; the gap
//! filling of [`improve`](super::improve) can pull it further forward into earlier idle time.
//! Each candidate is then simulated like any other: nothing here is trusted.

use std::collections::HashSet;

use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::timetable::Timetable;

use super::memory::unit_stages;
use pipewright_model::memory::device_levels;

/// Units per stage: whole stash, held after I until W, kept by a recomputed microbatch.
#[derive(Clone, Copy)]
pub(super) struct Weights<'a> {
    pub weights: &'a [f64],
    pub held: &'a [f64],
    pub kept: &'a [f64],
}

/// `tt` with `R`s added, each right before its microbatch's first backward, until every
/// device's peak fits `cap` units, or until nothing alive at an over-cap peak can shrink (the
/// result then still exceeds the cap, by the least this greedy reaches). Devices already
/// within the cap are left alone.
pub(super) fn fit(tt: &Timetable, w: Weights<'_>, cap: f64) -> Timetable {
    let mut out = tt.clone();
    for row in &mut out.devices {
        while let Some((stage, mb)) = victim(row, w, cap) {
            let Some(at) = row
                .iter()
                .position(|a| a.parts().any(|p| is_first_backward(p, stage, mb)))
            else {
                break;
            };
            row.insert(at, Action::new(stage, ActionKind::R, mb));
        }
    }
    out
}

/// The microbatch to recompute next on a device over the cap: of those alive at its peak
/// and not yet recomputed, the one forwarded first (its stash lives longest). `None` when the
/// device fits or nothing alive can shrink.
fn victim(row: &[Action], w: Weights<'_>, cap: f64) -> Option<(u32, u32)> {
    let named = row
        .iter()
        .flat_map(|a| a.parts())
        .filter(|p| p.kind == ActionKind::R)
        .map(|p| p.stage)
        .collect();
    let stages = unit_stages(&named, w.weights, w.held, w.kept);
    let lv = device_levels(row, &stages);
    let (peak_at, &peak) = lv
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))?;
    if peak <= cap + 1e-9 {
        return None;
    }
    let parts: Vec<Action> = row.iter().flat_map(|a| a.parts()).collect();
    let recomputed: HashSet<(u32, u32)> = parts
        .iter()
        .filter(|p| p.kind == ActionKind::R)
        .map(|p| (p.stage, p.microbatch))
        .collect();
    let shrinks = |s: u32| {
        let at = |v: &[f64]| v.get(s as usize).copied().unwrap_or(0.0);
        at(w.kept) < at(w.weights) - 1e-12
    };
    // Alive at the peak: forwarded at or before it, first backward after it (an R regrowing
    // at the peak is itself alive and already recomputed).
    parts[..=peak_at]
        .iter()
        .filter(|p| p.kind == ActionKind::F)
        .map(|p| (p.stage, p.microbatch))
        .filter(|&(s, mb)| !recomputed.contains(&(s, mb)) && shrinks(s))
        .find(|&(s, mb)| {
            parts[peak_at + 1..]
                .iter()
                .any(|p| is_first_backward(*p, s, mb))
        })
}

fn is_first_backward(p: Action, stage: u32, mb: u32) -> bool {
    p.stage == stage && p.microbatch == mb && p.kind.is_input_backward()
}

/// Number of `R` actions and of forwards in `tt`.
pub(super) fn count(tt: &Timetable) -> (u32, u32) {
    let all = tt.devices.iter().flatten().flat_map(|a| a.parts());
    all.fold((0, 0), |(r, f), p| match p.kind {
        ActionKind::R => (r + 1, f),
        ActionKind::F => (r, f + 1),
        _ => (r, f),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::peak_units_kept;
    use pipewright_schedule::generate;
    use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};

    fn one_f_one_b(p: u32, m: u32) -> Timetable {
        generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, p, 1, m, None).unwrap())
    }

    #[test]
    fn recomputes_only_what_the_cap_needs_and_then_fits() {
        let (p, m) = (4, 12);
        let tt = one_f_one_b(p, m);
        let ones = vec![1.0; p as usize];
        let kept = vec![0.25; p as usize];
        let w = Weights {
            weights: &ones,
            held: &ones,
            kept: &kept,
        };
        // 1F1B's device d peaks at p - d microbatches; a cap of 3 touches device 0 alone.
        let fitted = fit(&tt, w, 3.0);
        let peaks = peak_units_kept(&fitted, &ones, &ones, &kept);
        assert!(peaks.iter().all(|&x| x <= 3.0 + 1e-9), "{peaks:?}");
        for d in 1..p as usize {
            assert_eq!(fitted.devices[d], tt.devices[d], "device {d} already fits");
        }
        let rs = fitted.devices[0].iter().filter(|a| a.kind == ActionKind::R);
        let n = rs.count();
        assert!(n > 0 && n < m as usize, "{n} of {m} recomputed");
        // Every R sits right before its microbatch's backward.
        let row = &fitted.devices[0];
        for (i, a) in row.iter().enumerate() {
            if a.kind == ActionKind::R {
                let next = row[i + 1];
                assert!(next.kind == ActionKind::B && next.microbatch == a.microbatch);
            }
        }
        pipewright_schedule::validate::validate(&fitted).unwrap();
    }

    #[test]
    fn a_cap_below_one_recomputed_stash_cannot_be_met() {
        let tt = one_f_one_b(2, 4);
        let ones = [1.0, 1.0];
        let kept = [0.5, 0.5];
        let w = Weights {
            weights: &ones,
            held: &ones,
            kept: &kept,
        };
        // The regrown stash alone is a whole unit: the greedy gets as low as it can.
        let peak = |tt: &Timetable, kept: &[f64]| {
            let peaks = peak_units_kept(tt, &ones, &ones, kept);
            peaks.into_iter().fold(0.0, f64::max)
        };
        let least = fit(&tt, w, 0.9);
        assert!(peak(&least, &kept) > 0.9 && peak(&least, &kept) < peak(&tt, &kept));
        // Nothing shrinks when a stage keeps all it has.
        let w = Weights { kept: &ones, ..w };
        assert_eq!(fit(&tt, w, 1.5), tt);
    }
}
