//! DualPipeV (DeepSeek, "DeepSeek-V3 Technical Report", 2024, and its open DualPipe code):
//! two chunks per device in a V, with one chunk's forward overlapped with the other chunk's
//! backward as one [`ActionKind::Overlap`] action (F&B).
//!
//! Placement "v": device `r` holds stage `r` (chunk 0) and `2p - 1 - r` (chunk 1). With
//! `F0`, `F1`, `B0`, `B1`, `I*`, `W*` the chunk actions and `F0&B1` an overlap, device `r`:
//! 1. `2(p - 1 - r)` `F0`;
//! 2. `r + 1` pairs `F0 F1`;
//! 3. `p - 1 - r` triples `I1 W F1` (split backward; `W` takes the oldest pending one);
//! 4. `m - 2p + r + 1` pairs `F0&B1 F1&B0` (the last device runs its first as `F0 B1`, not
//!    overlapped, which shortens the bubble);
//! 5. `p - 1 - r` pairs `B1 F1&B0`;
//! 6. `r + 1` pairs `B1 B0`, switching to split `I`s halfway so that their `W`s can fill
//!    the tail;
//! 7. `p - 1 - r` pairs `W I0` (or `W B0`);
//! 8. the last `r + 1` pending `W`s.
//!
//! Bubble, per-chunk costs with `F = I`, F&B at its default cost `F + B`, no communication,
//! `m >= 2p`: `makespan - ideal = (p-1)(F&B + B - 3W)`, DeepSeek's `(PP/2 - 1)(F&B + B - 3W)`
//! for DualPipe with `PP = 2p` ranks (DualPipeV is DualPipe folded in half). With
//! `F = I = W = 1`: `2(p-1)`. Other costs (a cheaper F&B, `F != I`) leave this linear form
//! in simulation; it is not claimed for them.
//!
//! Peak activations: `2p + 1` stage-microbatches on every device, counting an F&B as its F
//! (stashing at its start) and its B (freeing at its end): `p + 1/2` microbatches of the
//! device's two chunks together. DeepSeek's `PP + 1` counts in chunks of the folded pipeline.
//!
//! Step 4 runs `m - 2p + 1` times on device 0, so `m >= 2p` is needed for the steady phase
//! to exist on every device (the spec checks it).

use std::collections::VecDeque;

use super::empty;
use crate::action::{Action, ActionKind};
use crate::spec::ScheduleSpec;
use crate::timetable::Timetable;

/// DualPipeV timetable.
pub fn dualpipev(spec: &ScheduleSpec) -> Timetable {
    let mut tt = empty(spec);
    let (p, m) = (spec.devices(), spec.microbatches());
    for (r, actions) in tt.devices.iter_mut().enumerate() {
        *actions = device_order(p, r as u32, m);
    }
    tt
}

/// One device's order under construction: the next microbatch of each chunk's forward and
/// backward, and the weight gradients split off but not yet run.
struct Device {
    stages: [u32; 2],
    next_f: [u32; 2],
    next_b: [u32; 2],
    pending_w: VecDeque<(u32, u32)>,
    out: Vec<Action>,
}

impl Device {
    fn f(&mut self, c: usize) {
        self.out
            .push(Action::new(self.stages[c], ActionKind::F, self.next_f[c]));
        self.next_f[c] += 1;
    }

    /// Backward of chunk `c`: full `B`, or `I` with its `W` queued for later.
    fn b(&mut self, c: usize, split: bool) {
        let (stage, mb) = (self.stages[c], self.next_b[c]);
        if split {
            self.out.push(Action::new(stage, ActionKind::I, mb));
            self.pending_w.push_back((stage, mb));
        } else {
            self.out.push(Action::new(stage, ActionKind::B, mb));
        }
        self.next_b[c] += 1;
    }

    /// Forward of chunk `f` overlapped with the full backward of chunk `b`.
    fn overlap(&mut self, f: usize, b: usize) {
        let (fs, fm) = (self.stages[f], self.next_f[f]);
        let (bs, bm) = (self.stages[b], self.next_b[b]);
        self.out.push(Action::overlap(fs, fm, bs, bm));
        self.next_f[f] += 1;
        self.next_b[b] += 1;
    }

    fn w(&mut self) {
        if let Some((stage, mb)) = self.pending_w.pop_front() {
            self.out.push(Action::new(stage, ActionKind::W, mb));
        }
    }
}

fn device_order(p: u32, r: u32, m: u32) -> Vec<Action> {
    let mut d = Device {
        stages: [r, 2 * p - 1 - r],
        next_f: [0; 2],
        next_b: [0; 2],
        pending_w: VecDeque::new(),
        out: Vec::with_capacity(4 * m as usize),
    };
    for _ in 0..2 * (p - 1 - r) {
        d.f(0);
    }
    for _ in 0..=r {
        d.f(0);
        d.f(1);
    }
    for _ in 0..p - 1 - r {
        d.b(1, true);
        d.w();
        d.f(1);
    }
    for i in 0..m + r + 1 - 2 * p {
        if i == 0 && r == p - 1 {
            d.f(0);
            d.b(1, false);
        } else {
            d.overlap(0, 1);
        }
        d.overlap(1, 0);
    }
    for _ in 0..p - 1 - r {
        d.b(1, false);
        d.overlap(1, 0);
    }
    let mut split = false;
    let half = r.div_ceil(2);
    for i in 0..=r {
        split |= i == half && r % 2 == 1;
        d.b(1, split);
        split |= i == half && r % 2 == 0;
        d.b(0, split);
    }
    for _ in 0..p - 1 - r {
        d.w();
        d.b(0, split);
    }
    while !d.pending_w.is_empty() {
        d.w();
    }
    d.out
}
