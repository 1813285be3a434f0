//! ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): extra warm-up forwards fill
//! the wait for the first input gradient; a longer tail of deferred weight gradients fills
//! the wait for the last ones. Costs as in [`zb_h1`](super::zb_h1): the paper's `B` is our `I`.
//!
//! Device `r` warms up with `2(p - 1 - r) + 1` forwards, what fits between its first input
//! (time `r F`) and its first input gradient (time `(2p - 1 - r) F` when `F = I`), and defers
//! `2r` weight gradients: `2p - 1` stage-microbatches stashed at peak on every device.
//!
//! Bubble of one step, `m >= 2p - 1`, point-to-point latency `c`:
//! `makespan - ideal = (p-1) max(F + c, F + I + 2c - 2W)`. The second term is the paper's
//! `(p-1)(F + B + 2c - 2W)`: the time the last input gradients take to travel back that the
//! deferred `W`s cannot cover. The paper reaches zero when `F = I = W` by counting per
//! iteration with the optimizer step post-validated, so that the next step's parallelogram
//! starts on device 0 while the last devices finish. A single step cannot hide the start-up
//! skew: the last device gets its first input only after `p - 1` forwards and hops,
//! `(p-1)(F + c)`, and then has `ideal` work to do. With `F = I = W`, `c = 0`, every device
//! runs without a gap from `r F` to `r F + m(F+I+W)`, a parallelogram: bubble `(p-1) F`.

use super::{empty, zero_bubble::zb_device_order};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// ZB-H2 timetable.
pub fn zb_h2(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, m) = (spec.devices(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let r = r as u32;
        *actions = zb_device_order(r, m, 2 * (p - 1 - r) + 1, 2 * r);
    }
    tt
}
