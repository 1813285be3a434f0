//! The zero-bubble paper's greedy heuristic (Qi et al., ICLR 2024, section 3.1), one chunk per
//! device: built microbatch by microbatch ("rounds") rather than event by event.
//!
//! The warm-up gives each device as many forwards as fit its memory and end before its first
//! input backward could arrive, so that backward never queues. Each later round gives every
//! device at most one forward (a device never runs ahead of the one before it) and then the
//! round's input backward, from the last device back to the first. Weight backwards (W) are
//! kept back: one runs only to make room for a forward, or in a wait for an input that is at
//! least as long as the W, or (by a knob) in a shorter wait when this device's idle time would
//! otherwise become the largest of all. What is kept back fills the tails, where devices wait
//! for the last backwards. Device 0 runs its whole backlog of W's once its forwards are done,
//! before each input backward. The knobs are the paper's hyperparameters, searched over.
//!
//! Times are planned with the real costs (each action starts when its device is free and its
//! input has arrived), and memory is counted in the search's units with the split that the
//! costs give: F adds its stage's weight, I frees all but the part W still needs, W frees
//! that part. The result is a timetable like any other: the search validates and simulates it.

use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::spec::Placement;
use pipewright_schedule::timetable::Timetable;
use pipewright_sim::simulate::CostModel;

/// The heuristic's three choices (the paper's grid of binary hyperparameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundKnobs {
    /// Warm-up: also start a forward that ends after the first backward could arrive (a
    /// small wait before it instead of none).
    pub late_warmup: bool,
    /// Let a device two or more forwards ahead of the next one skip a forward when that
    /// costs no idle time, so its input backward comes sooner.
    pub backward_first: bool,
    /// Run a W in a wait shorter than it even when this device's idle time stays below the
    /// largest device's (otherwise only when it would become the largest).
    pub greedy_fill: bool,
}

impl RoundKnobs {
    /// Every combination.
    pub const ALL: [RoundKnobs; 8] = {
        let mut all = [RoundKnobs {
            late_warmup: false,
            backward_first: false,
            greedy_fill: false,
        }; 8];
        let mut i = 0;
        while i < 8 {
            all[i] = RoundKnobs {
                late_warmup: i & 1 != 0,
                backward_first: i & 2 != 0,
                greedy_fill: i & 4 != 0,
            };
            i += 1;
        }
        all
    };

    /// A short description for reports.
    pub fn label(&self, cap: f64) -> String {
        let mut label = format!("rounds v=1, I/W, cap {}", super::list::fmt_units(cap));
        for (on, what) in [
            (self.late_warmup, ", late warm-up"),
            (self.backward_first, ", backward first"),
            (self.greedy_fill, ", greedy fill"),
        ] {
            if on {
                label += what;
            }
        }
        label
    }
}

/// Plan one step of `m` microbatches on `p` devices (one stage each, split backwards) under a
/// cap of `cap` units; `weights` and `held` are each stage's units from F to I and from I to
/// W. `None` when the cap cannot hold the plan (a forward that no W can make room for).
pub fn round_schedule(
    p: u32,
    m: u32,
    costs: &CostModel,
    weights: &[f64],
    held: &[f64],
    cap: f64,
    knobs: RoundKnobs,
) -> Option<Timetable> {
    if p == 0 || m == 0 || costs.stages.len() != p as usize {
        return None;
    }
    let mut plan = Plan::new(p, m, costs, weights, held, cap);
    plan.warm_up(knobs)?;
    for round in 1..m {
        plan.round(round, knobs)?;
    }
    for d in 0..p as usize {
        while plan.w[d] < plan.i[d] {
            plan.put(d, ActionKind::W)?;
        }
    }
    Some(plan.tt)
}

/// The plan so far: per device, counts of F, I and W placed, end of its last action, memory
/// held and idle time since its first action; per device and microbatch, when F and I end.
struct Plan<'a> {
    tt: Timetable,
    costs: &'a CostModel,
    weights: &'a [f64],
    held: &'a [f64],
    cap: f64,
    m: u32,
    f: Vec<u32>,
    i: Vec<u32>,
    w: Vec<u32>,
    end: Vec<f64>,
    mem: Vec<f64>,
    idle: Vec<f64>,
    f_end: Vec<Vec<f64>>,
    i_end: Vec<Vec<f64>>,
}

impl<'a> Plan<'a> {
    fn new(
        p: u32,
        m: u32,
        costs: &'a CostModel,
        weights: &'a [f64],
        held: &'a [f64],
        cap: f64,
    ) -> Self {
        let n = p as usize;
        Plan {
            tt: Timetable::empty("list", p, p, m, Placement::Loop),
            costs,
            weights,
            held,
            cap,
            m,
            f: vec![0; n],
            i: vec![0; n],
            w: vec![0; n],
            end: vec![0.0; n],
            mem: vec![0.0; n],
            idle: vec![0.0; n],
            f_end: vec![vec![0.0; m as usize]; n],
            i_end: vec![vec![0.0; m as usize]; n],
        }
    }

    fn devices(&self) -> usize {
        self.f.len()
    }

    fn cost(&self, d: usize, kind: ActionKind) -> f64 {
        self.costs.stages[d].of(kind)
    }

    fn comm(&self, boundary: usize) -> f64 {
        self.costs.transfer_time(boundary as u32)
    }

    /// Units `kind` adds to device `d`'s memory (negative when it frees).
    fn delta(&self, d: usize, kind: ActionKind) -> f64 {
        match kind {
            ActionKind::F => self.weights[d],
            ActionKind::I => -(self.weights[d] - self.held[d]),
            ActionKind::W => -self.held[d],
            _ => 0.0,
        }
    }

    /// When the input of device `d`'s next action of `kind` arrives (0 when it has none).
    fn arrival(&self, d: usize, kind: ActionKind) -> f64 {
        match kind {
            ActionKind::F if d > 0 => self.f_end[d - 1][self.f[d] as usize] + self.comm(d - 1),
            ActionKind::I if d + 1 < self.devices() => {
                self.i_end[d + 1][self.i[d] as usize] + self.comm(d)
            }
            _ => 0.0,
        }
    }

    fn largest_idle(&self) -> f64 {
        self.idle.iter().copied().fold(0.0, f64::max)
    }

    /// Place device `d`'s next action of `kind`; `None` if it breaks the cap.
    fn put(&mut self, d: usize, kind: ActionKind) -> Option<()> {
        let delta = self.delta(d, kind);
        if self.mem[d] + delta > self.cap + 1e-9 {
            return None;
        }
        let dur = self.cost(d, kind);
        let free = self.end[d];
        let start = free.max(self.arrival(d, kind));
        if self.f[d] > 0 {
            self.idle[d] += start - free;
        }
        let end = start + dur;
        self.end[d] = end;
        self.mem[d] += delta;
        let mb = match kind {
            ActionKind::F => {
                self.f_end[d][self.f[d] as usize] = end;
                self.f[d] += 1;
                self.f[d] - 1
            }
            ActionKind::I => {
                self.i_end[d][self.i[d] as usize] = end;
                self.i[d] += 1;
                self.i[d] - 1
            }
            _ => {
                self.w[d] += 1;
                self.w[d] - 1
            }
        };
        self.tt.devices[d].push(Action::new(d as u32, kind, mb));
        Some(())
    }

    /// The first round: microbatch 0 through every device, each device's extra warm-up
    /// forwards, then microbatch 0's input backwards from the last device to the first.
    fn warm_up(&mut self, knobs: RoundKnobs) -> Option<()> {
        let n = self.devices();
        for d in 0..n {
            self.put(d, ActionKind::F)?;
        }
        let mut extra = vec![0u32; n];
        // When device d's first input backward could start: after device d+1's ends.
        let mut backward_at = self.end[n - 1] + self.cost(n - 1, ActionKind::I);
        for d in (0..n.saturating_sub(1)).rev() {
            let arrives = backward_at + self.comm(d);
            let (mut mem, mut busy) = (self.mem[d], self.end[d]);
            while self.f[d] + extra[d] < self.m && mem + self.weights[d] <= self.cap + 1e-9 {
                let f = self.cost(d, ActionKind::F);
                let stop = if knobs.late_warmup {
                    busy + f > arrives
                } else {
                    busy >= arrives
                };
                if stop {
                    break;
                }
                mem += self.weights[d];
                busy += f;
                extra[d] += 1;
            }
            backward_at = busy.max(arrives) + self.cost(d, ActionKind::I);
        }
        // A device never holds as many warm-up forwards as the one before it.
        for d in 1..n {
            while extra[d] > 0 && extra[d] >= extra[d - 1] && self.f[d] + extra[d] < self.m {
                extra[d] -= 1;
            }
        }
        for (d, &count) in extra.iter().enumerate() {
            for _ in 0..count {
                self.put(d, ActionKind::F)?;
            }
        }
        for d in (0..n).rev() {
            self.put(d, ActionKind::I)?;
        }
        Some(())
    }

    /// One later round: a forward on each device that takes one, then microbatch `round`'s
    /// input backwards from the last device to the first.
    fn round(&mut self, round: u32, knobs: RoundKnobs) -> Option<()> {
        let n = self.devices();
        let mut take: Vec<bool> = (0..n).map(|d| self.takes_forward(d, knobs)).collect();
        // A device takes a forward only if the next one does: it must stay ahead of it.
        for d in (0..n.saturating_sub(1)).rev() {
            take[d] = take[d] && take[d + 1];
        }
        for (d, &takes) in take.iter().enumerate() {
            if !takes {
                continue;
            }
            while self.mem[d] + self.weights[d] > self.cap + 1e-9 {
                if self.w[d] >= self.i[d] {
                    return None;
                }
                self.put(d, ActionKind::W)?;
            }
            self.fill_wait(d, ActionKind::F, knobs)?;
            self.put(d, ActionKind::F)?;
        }
        for d in (0..n).rev() {
            debug_assert_eq!(self.i[d], round);
            self.fill_wait(d, ActionKind::I, knobs)?;
            if d == 0 && self.f[d] == self.m {
                while self.w[d] < self.i[d] {
                    self.put(d, ActionKind::W)?;
                }
            }
            self.put(d, ActionKind::I)?;
        }
        Some(())
    }

    /// Whether device `d` takes a forward this round.
    fn takes_forward(&self, d: usize, knobs: RoundKnobs) -> bool {
        if self.f[d] >= self.m {
            return false;
        }
        let n = self.devices();
        if !knobs.backward_first || d + 1 >= n || self.f[d] < self.f[d + 1] + 2 {
            return true;
        }
        // When the next device's input backward could be back here: after its own next
        // forward and backward.
        let next = self.end[d + 1]
            + self.cost(d + 1, ActionKind::F)
            + self.cost(d + 1, ActionKind::I)
            + self.comm(d);
        if self.end[d] >= next {
            return false;
        }
        // The W's that must run first to make room for the forward.
        let (mut mem, mut w_time, mut count) = (self.mem[d] + self.weights[d], 0.0, 0);
        while mem > self.cap + 1e-9 && self.w[d] + count < self.i[d] {
            w_time += self.cost(d, ActionKind::W);
            mem -= self.held[d];
            count += 1;
        }
        if self.end[d] + self.cost(d, ActionKind::F) + w_time <= next {
            return true;
        }
        // Skipping leaves a wait; skip only if it keeps this device below the largest idle.
        next - self.end[d] > self.largest_idle() - self.idle[d]
    }

    /// Run W's in device `d`'s wait for its next `kind`'s input: every W that ends before the
    /// input arrives, then one more if the wait left is worth filling.
    fn fill_wait(&mut self, d: usize, kind: ActionKind, knobs: RoundKnobs) -> Option<()> {
        let has_input = match kind {
            ActionKind::F => d > 0,
            _ => d + 1 < self.devices(),
        };
        if !has_input {
            return Some(());
        }
        let arrives = self.arrival(d, kind);
        let w = self.cost(d, ActionKind::W);
        while self.w[d] < self.i[d] && self.end[d] + w <= arrives {
            self.put(d, ActionKind::W)?;
        }
        if self.w[d] < self.i[d] && self.end[d] < arrives {
            let within = arrives - self.end[d] <= self.largest_idle() - self.idle[d];
            if !within || knobs.greedy_fill {
                self.put(d, ActionKind::W)?;
            }
        }
        Some(())
    }
}
