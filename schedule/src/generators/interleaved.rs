//! Interleaved 1F1B (Megatron-LM): `v` model chunks per device, placement "loop".
//!
//! Microbatches go in groups of `g` (default `p`). Every device runs chunk-forwards in one
//! order: for each group, chunk 0 of each microbatch of the group, then chunk 1, and so on;
//! chunk-backwards run in the same order with chunks reversed. Device `r` warms up with
//! `2(p-r-1) + (v-1)g` chunk-forwards, then alternates one forward and one backward, then
//! cools down. Bubble `(p-1)/(vm+p-1)` with uniform costs.
//!
//! Unlike Megatron, `m` need not be a multiple of `p`: microbatches that would form a last
//! group smaller than `g` join the group before it instead, so no group is ever shorter than
//! `p` and chunk `k+1` of a microbatch never waits for it to come around the ring.

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// Interleaved 1F1B timetable. With `v = 1` it is exactly 1F1B.
pub fn interleaved_1f1b(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, v) = (spec.devices(), spec.virtual_stages());
    let (order, largest_group) = chunk_order(spec.microbatches(), v, spec.group_size());
    let n = order.len() as u32;
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        let warmup = if v == 1 {
            p - r - 1
        } else {
            2 * (p - r - 1) + (v - 1) * largest_group
        }
        .min(n);
        let f = |k: u32| {
            let (chunk, mb) = order[k as usize];
            Action::new(chunk * p + r, ActionKind::F, mb)
        };
        let b = |k: u32| {
            let (chunk, mb) = order[k as usize];
            Action::new((v - 1 - chunk) * p + r, ActionKind::B, mb)
        };
        actions.reserve(2 * n as usize);
        actions.extend((0..warmup).map(f));
        for k in 0..n - warmup {
            actions.push(f(warmup + k));
            actions.push(b(k));
        }
        actions.extend((n - warmup..n).map(b));
    }
    tt
}

/// The (chunk, microbatch) order every device follows for its chunk-forwards, and the size
/// of the largest group.
fn chunk_order(m: u32, v: u32, g: u32) -> (Vec<(u32, u32)>, u32) {
    let mut order = Vec::with_capacity((m * v) as usize);
    let (mut start, mut largest) = (0, 0);
    while start < m {
        // A short tail joins the group before it, so every group holds at least g.
        let end = if m - start < 2 * g { m } else { start + g };
        for chunk in 0..v {
            order.extend((start..end).map(|mb| (chunk, mb)));
        }
        largest = largest.max(end - start);
        start = end;
    }
    (order, largest)
}
