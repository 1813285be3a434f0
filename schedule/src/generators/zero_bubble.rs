//! The single-chunk zero-bubble order shared by ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble
//! Pipeline Parallelism", 2023).
//!
//! The backward is split into `I` (input gradient, on the critical path between devices)
//! and `W` (weight gradient, needed by nobody but the optimizer). Device `r` runs `warmup`
//! forwards, then for each microbatch `k`: `I(k)`, the `W` deferred `defer` microbatches
//! back, and the next forward; the last `defer` weight gradients close the step, filling the
//! time the final input gradients take to travel back to device 0.

use crate::action::{Action, ActionKind};

/// Actions of one device holding one stage: `warmup` forwards, then `I(k)`, `W(k - defer)`,
/// `F(warmup + k)` for each `k`, then the deferred `W`s.
pub(super) fn zb_device_order(stage: u32, m: u32, warmup: u32, defer: u32) -> Vec<Action> {
    let warmup = warmup.min(m);
    let act = |kind, mb| Action::new(stage, kind, mb);
    let mut out = Vec::with_capacity(3 * m as usize);
    out.extend((0..warmup).map(|mb| act(ActionKind::F, mb)));
    for k in 0..m {
        out.push(act(ActionKind::I, k));
        if k >= defer {
            out.push(act(ActionKind::W, k - defer));
        }
        if warmup + k < m {
            out.push(act(ActionKind::F, warmup + k));
        }
    }
    out.extend((m.saturating_sub(defer)..m).map(|mb| act(ActionKind::W, mb)));
    out
}
