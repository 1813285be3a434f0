//! ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): two chunks per
//! device in a V, with the backward split into `I` and `W`.
//!
//! Placement "v": chunk 0 of device `r` is stage `r`, chunk 1 is stage `2p - 1 - r`, so the
//! last stage sits on device 0 next to the first and a microbatch turns round on device 0
//! without leaving it. Device `r` runs (counting `F0`, `F1` the chunk forwards):
//! - warm-up: `2(p - r) - 1` `F0`, then `r` pairs `F1 F0`, then `p - r` triples `F1 I1 W1`;
//! - steady: `F0 I0 W0 F1 I1 W1` until every forward is issued;
//! - cool-down: `r` pairs `I0 I1`, then `p - r` pairs `I0 W0`, then the deferred `W`s.
//!
//! Bubble with per-chunk costs `F = I = W`, no communication, `m >= 2p - 1`:
//! `makespan - ideal = (p-1) F`, the start-up skew alone (device `p-1` gets its first input
//! after `p - 1` chunk-forwards, then has `ideal` work to do, and never waits again; the turn
//! on device 0 and the deferred `W`s fill everything else). As a fraction `(p-1)/(6m+p-1)`.
//!
//! Peak activations: `2p` stage-microbatches on every device. A stage here is one of the two
//! chunks, half a device's layers, so that is `p` microbatches of the device's whole share of
//! the model: 1F1B's peak on device 0, now on every device.
//!
//! The order is built for `n = max(m, 2p - 1)` microbatches (the warm-up needs that many) and
//! the actions of microbatches `m..n` are then dropped: removing whole microbatches keeps
//! every dependency of the rest, so the result is as valid as the full order.

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// ZB-V timetable.
pub fn zbv(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, m) = (spec.devices(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        let mut order = device_order(p, r as u32, m.max(2 * p - 1));
        order.retain(|a| a.microbatch < m);
        *actions = order;
    }
    tt
}

/// Next microbatch of each (chunk, kind) on one device.
struct Counters {
    stages: [u32; 2],
    next: [[u32; 3]; 2],
    out: Vec<Action>,
}

impl Counters {
    fn push(&mut self, chunk: usize, kind: ActionKind) {
        let slot = match kind {
            ActionKind::F => 0,
            ActionKind::I => 1,
            _ => 2,
        };
        let mb = self.next[chunk][slot];
        self.next[chunk][slot] += 1;
        self.out.push(Action::new(self.stages[chunk], kind, mb));
    }

    fn count(&self, chunk: usize, kind: ActionKind) -> u32 {
        self.next[chunk][usize::from(kind != ActionKind::F) + usize::from(kind == ActionKind::W)]
    }
}

fn device_order(p: u32, r: u32, n: u32) -> Vec<Action> {
    use ActionKind::{F, I, W};
    let mut c = Counters {
        stages: [r, 2 * p - 1 - r],
        next: [[0; 3]; 2],
        out: Vec::with_capacity(6 * n as usize),
    };
    for _ in 0..2 * (p - r) - 1 {
        c.push(0, F);
    }
    for _ in 0..r {
        c.push(1, F);
        c.push(0, F);
    }
    for _ in 0..p - r {
        c.push(1, F);
        c.push(1, I);
        c.push(1, W);
    }
    while c.count(1, F) < c.count(0, F) || c.count(0, F) < n {
        if c.count(0, F) < n {
            c.push(0, F);
        }
        c.push(0, I);
        c.push(0, W);
        c.push(1, F);
        c.push(1, I);
        c.push(1, W);
    }
    for _ in 0..r {
        c.push(0, I);
        c.push(1, I);
    }
    for _ in 0..p - r {
        c.push(0, I);
        c.push(0, W);
    }
    while c.count(1, W) < n {
        c.push(1, W);
    }
    while c.count(0, W) < n {
        c.push(0, W);
    }
    c.out
}
