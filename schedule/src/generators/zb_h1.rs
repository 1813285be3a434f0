//! ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's memory, with the
//! weight gradients moved into its bubbles.
//!
//! Our `B` is the full backward, `I + W`; the paper's `B` is our `I` (the input gradient,
//! the only part the previous stage waits for) and its `W` is ours.
//!
//! Device `r` warms up with `p - r` forwards (1F1B's `p - r - 1` and its first steady one),
//! then runs `I(k)`, `W(k - r)`, `F(k + p - r)` for each `k`, then its last `r` weight
//! gradients. Deferring `r` of them keeps `(p - r) + r = p` stage-microbatches stashed on every
//! device: 1F1B's peak on device 0.
//!
//! Bubble, costs `F`, `I`, `W` per stage, no communication, `m >= p`, `W <= F`:
//! `makespan - ideal = (p-1)(F + I - W)`. Derivation: device `p-1` starts at `(p-1)F` and never
//! waits, so its last `I` ends at `(p-1)F + m(F+I+W) - pW` (`p` of its `W`s follow it); that
//! gradient takes `(p-1)I` to reach device 0, which then runs its one last `W`:
//! `m(F+I+W) + (p-1)(F+I-W)`. (With `W > F` the start-up skew `(p-1)F` dominates instead.)

use super::{empty, zero_bubble::zb_device_order};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// ZB-H1 timetable.
pub fn zb_h1(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, m) = (spec.devices(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        *actions = zb_device_order(r, m, p - r, r);
    }
    tt
}
