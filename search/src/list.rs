//! The search's own list scheduler: it plays one step forward in time with the real costs and,
//! whenever a device is free, starts the best action that is ready and fits its memory.
//!
//! Priorities follow the zero-bubble insight. An input-gradient backward (I, or B when the
//! backward is not split) is on the critical path: the previous stage waits for it. A forward
//! keeps the pipeline fed, but only while the device's memory allows. A weight-gradient
//! backward (W) waits on nobody, so it fills the gaps, and runs when memory is full (it frees
//! the activations). A microbatch enters a device only when the device can also hold its
//! later chunks there (a V's return leg, an interleaved device's next loop), so the cap can
//! never wedge a microbatch halfway.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use super::memory::held_weights;
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::spec::Placement;
use pipewright_schedule::timetable::Timetable;
use pipewright_sim::simulate::CostModel;

/// The choices that shape one list schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knobs {
    /// Chunks per device.
    pub v: u32,
    /// Stage placement.
    pub placement: Placement,
    /// Split backwards into I and W (else one B).
    pub split: bool,
    /// When both are ready, run the input backward before a forward.
    pub backward_first: bool,
    /// Among ready forwards, prefer the deepest stage (else the oldest microbatch).
    pub depth_first: bool,
    /// Memory the scheduler may use per device, in units (at most the user's cap).
    pub cap: f64,
    /// Wait for an input backward that arrives before a forward or W would end, instead of
    /// starting that work: the backward chain back to device 0 then never queues behind
    /// other work, which shortens device 0's wait for its first backward (a gap inside its
    /// span, so in the steady-state period).
    pub lookahead: bool,
    /// Start a W only where it cannot delay critical work: when it ends before the next
    /// input backward or fitting forward arrives, or when memory keeps every forward out and
    /// no input backward is due before it would end. A W started in a short wait delays the
    /// backward (or the last device's forward) behind it, and every earlier device in turn;
    /// W's kept back fill the devices' tails instead, which are gaps in the span otherwise.
    pub w_in_gaps: bool,
}

impl Knobs {
    /// A short description for reports.
    pub fn label(&self) -> String {
        let place = match self.placement {
            Placement::Loop => "loop",
            Placement::V => "V",
        };
        let back = if self.split { "I/W" } else { "B" };
        let order = match (self.backward_first, self.depth_first) {
            (true, true) => "",
            (true, false) => ", oldest first",
            (false, true) => ", forward first",
            (false, false) => ", forward first, oldest first",
        };
        let look = if self.lookahead { ", lookahead" } else { "" };
        let gaps = if self.w_in_gaps { ", W in gaps" } else { "" };
        format!(
            "list v={} {place}, {back}, cap {}{order}{look}{gaps}",
            self.v,
            fmt_units(self.cap)
        )
    }
}

/// A number of units with at most two decimals and no trailing zeros (`2`, `2.5`, `0.33`).
pub fn fmt_units(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Schedule `m` microbatches on `p` devices; `None` if the cap stops every device at once.
/// `costs` and `weights` have one entry per stage (`p * v`).
pub fn list_schedule(
    p: u32,
    m: u32,
    costs: &CostModel,
    weights: &[f64],
    knobs: Knobs,
) -> Option<Timetable> {
    let stages = p * knobs.v;
    let tt = Timetable::empty("list", p, stages, m, knobs.placement);
    let mut s = State::new(tt, costs, weights, knobs);
    s.run()?;
    Some(s.tt)
}

/// A time in the event queue, ordered for a min-heap.
#[derive(Clone, Copy, PartialEq)]
struct Time(f64);

impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// An action whose inputs are known, with the time they are there.
#[derive(Clone, Copy, Debug)]
struct Pending {
    stage: u32,
    mb: u32,
    ready: f64,
}

struct State<'a> {
    tt: Timetable,
    costs: &'a CostModel,
    weights: &'a [f64],
    knobs: Knobs,
    m: u32,
    /// Units a microbatch entering each device will need there over all its chunks.
    need: Vec<f64>,
    /// Units each stage still holds after its I until its W.
    held: Vec<f64>,
    /// First (lowest) stage of each device: where a microbatch enters it.
    first: Vec<u32>,
    free: Vec<f64>,
    mem: Vec<f64>,
    reserved: Vec<f64>,
    forwards: Vec<Vec<Pending>>,
    backwards: Vec<Vec<Pending>>,
    weight_grads: Vec<VecDeque<(u32, u32)>>,
    clock: BinaryHeap<Reverse<Time>>,
    left: usize,
}

impl<'a> State<'a> {
    fn new(tt: Timetable, costs: &'a CostModel, weights: &'a [f64], knobs: Knobs) -> Self {
        let p = tt.num_devices() as usize;
        let mut need = vec![0.0; p];
        let mut first = vec![u32::MAX; p];
        for (s, &d) in tt.stage_device.iter().enumerate() {
            need[d as usize] += weights[s];
            first[d as usize] = first[d as usize].min(s as u32);
        }
        let m = tt.microbatches;
        let per_mb = if knobs.split { 3 } else { 2 };
        let left = tt.stage_device.len() * m as usize * per_mb;
        let mut s = State {
            m,
            need,
            held: held_weights(costs, weights),
            first,
            free: vec![0.0; p],
            mem: vec![0.0; p],
            reserved: vec![0.0; p],
            forwards: vec![Vec::new(); p],
            backwards: vec![Vec::new(); p],
            weight_grads: vec![VecDeque::new(); p],
            clock: BinaryHeap::new(),
            left,
            tt,
            costs,
            weights,
            knobs,
        };
        let entry = s.dev(0) as usize;
        s.forwards[entry].push(Pending {
            stage: 0,
            mb: 0,
            ready: 0.0,
        });
        s.clock.push(Reverse(Time(0.0)));
        s
    }

    fn dev(&self, stage: u32) -> u32 {
        self.tt.stage_device[stage as usize]
    }

    fn stages(&self) -> u32 {
        self.tt.stage_device.len() as u32
    }

    /// Play the step; `None` on a wedge (no device can move and nothing is under way).
    fn run(&mut self) -> Option<()> {
        let mut last = f64::NEG_INFINITY;
        while let Some(Reverse(Time(t))) = self.clock.pop() {
            if t <= last {
                continue;
            }
            last = t;
            while self.start_ready(t) {}
        }
        (self.left == 0).then_some(())
    }

    /// Start one action on every device that is free at `t` and has one; whether any started.
    fn start_ready(&mut self, t: f64) -> bool {
        let mut any = false;
        for d in 0..self.tt.devices.len() {
            if self.free[d] <= t {
                if let Some(a) = self.choose(d as u32, t) {
                    self.start(d as u32, a, t);
                    any = true;
                }
            }
        }
        any
    }

    fn choose(&mut self, d: u32, t: f64) -> Option<Action> {
        let back = self.ready_backward(d, t);
        if back.is_none() && self.knobs.lookahead && self.backward_soon(d, t) {
            return None;
        }
        if self.knobs.backward_first {
            if let Some(b) = back {
                return Some(self.take_backward_at(d, b));
            }
        }
        if let Some(f) = self.best_forward(d, t) {
            let p = self.forwards[d as usize].swap_remove(f);
            return Some(Action::new(p.stage, ActionKind::F, p.mb));
        }
        if let Some(b) = back {
            return Some(self.take_backward_at(d, b));
        }
        let &(stage, mb) = self.weight_grads[d as usize].front()?;
        if self.knobs.w_in_gaps && !self.w_fits(d, t, self.costs.stages[stage as usize].w) {
            return None;
        }
        self.weight_grads[d as usize].pop_front();
        Some(Action::new(stage, ActionKind::W, mb))
    }

    /// Whether a W of duration `w` started at `t` delays no critical work on `d`: no input
    /// backward arrives before it would end, and no forward that fits memory either (a
    /// forward that does not fit needs the memory W frees, so it does not count).
    fn w_fits(&self, d: u32, t: f64, w: f64) -> bool {
        let di = d as usize;
        let end = t + w - 1e-9;
        let backward_due = self.backwards[di].iter().any(|p| p.ready < end);
        let forward_due = self.forwards[di]
            .iter()
            .any(|p| p.ready > t && p.ready < end && self.fits(di, p));
        !backward_due && !forward_due
    }

    /// Whether forward `p` fits device `di`'s memory now.
    fn fits(&self, di: usize, p: &Pending) -> bool {
        let room = self.knobs.cap + 1e-9 - self.mem[di] - self.reserved[di];
        p.stage != self.first[di] || self.need[di] <= room
    }

    /// Whether an input backward arrives before the shortest other work would end.
    fn backward_soon(&self, d: u32, t: f64) -> bool {
        let di = d as usize;
        let soonest = self.backwards[di]
            .iter()
            .map(|p| p.ready)
            .filter(|&r| r > t)
            .fold(f64::INFINITY, f64::min);
        let shortest = self.forwards[di]
            .iter()
            .filter(|p| p.ready <= t)
            .map(|p| self.costs.stages[p.stage as usize].f)
            .chain(
                self.weight_grads[di]
                    .front()
                    .map(|&(s, _)| self.costs.stages[s as usize].w),
            )
            .fold(f64::INFINITY, f64::min);
        soonest < t + shortest
    }

    /// Index of the ready backward to run next: the oldest microbatch, then the deepest stage.
    fn ready_backward(&self, d: u32, t: f64) -> Option<usize> {
        self.backwards[d as usize]
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ready <= t)
            .min_by_key(|(_, p)| (p.mb, Reverse(p.stage)))
            .map(|(i, _)| i)
    }

    fn take_backward_at(&mut self, d: u32, i: usize) -> Action {
        let p = self.backwards[d as usize].swap_remove(i);
        let kind = if self.knobs.split {
            ActionKind::I
        } else {
            ActionKind::B
        };
        Action::new(p.stage, kind, p.mb)
    }

    /// Index of the ready forward that fits in memory and comes first by the knobs.
    fn best_forward(&self, d: u32, t: f64) -> Option<usize> {
        let di = d as usize;
        let ready = self.forwards[di]
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ready <= t && self.fits(di, p));
        if self.knobs.depth_first {
            ready.min_by_key(|(_, p)| (Reverse(p.stage), p.mb))
        } else {
            ready.min_by_key(|(_, p)| (p.mb, p.stage))
        }
        .map(|(i, _)| i)
    }

    fn start(&mut self, d: u32, a: Action, t: f64) {
        let di = d as usize;
        let end = t + self.costs.duration(a);
        self.free[di] = end;
        self.clock.push(Reverse(Time(end)));
        self.tt.devices[di].push(a);
        self.left -= 1;
        let (s, mb) = (a.stage, a.microbatch);
        let w = self.weights[s as usize];
        match a.kind {
            ActionKind::F => self.forward_done(d, s, mb, w, end),
            ActionKind::B | ActionKind::I => {
                if a.kind == ActionKind::B {
                    self.mem[di] -= w;
                } else {
                    self.mem[di] -= w - self.held[s as usize];
                    self.weight_grads[di].push_back((s, mb));
                }
                if s > 0 {
                    let ready = self.arrival(d, s - 1, s - 1, end);
                    self.push(true, s - 1, mb, ready);
                }
            }
            ActionKind::W => self.mem[di] -= self.held[s as usize],
            _ => {}
        }
    }

    fn forward_done(&mut self, d: u32, s: u32, mb: u32, w: f64, end: f64) {
        let di = d as usize;
        self.mem[di] += w;
        if s == self.first[di] {
            self.reserved[di] += self.need[di] - w;
        } else {
            self.reserved[di] -= w;
        }
        if s == 0 && mb + 1 < self.m {
            self.forwards[di].push(Pending {
                stage: 0,
                mb: mb + 1,
                ready: 0.0,
            });
        }
        if s + 1 < self.stages() {
            let ready = self.arrival(d, s + 1, s, end);
            self.push(false, s + 1, mb, ready);
        } else {
            self.push(true, s, mb, end);
        }
    }

    /// When data produced on `d` at `end` is there for `stage`'s device, crossing the
    /// boundary after stage `boundary` (whose output size sets the transfer time).
    fn arrival(&self, d: u32, stage: u32, boundary: u32, end: f64) -> f64 {
        if self.dev(stage) == d {
            end
        } else {
            end + self.costs.transfer_time(boundary)
        }
    }

    fn push(&mut self, backward: bool, stage: u32, mb: u32, ready: f64) {
        let d = self.dev(stage) as usize;
        let p = Pending { stage, mb, ready };
        if backward {
            self.backwards[d].push(p);
        } else {
            self.forwards[d].push(p);
        }
        self.clock.push(Reverse(Time(ready)));
    }
}
