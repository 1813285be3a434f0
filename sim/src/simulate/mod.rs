//! The timed simulator: when each action of a timetable runs, given real durations.
//!
//! Each device has a compute stream, which runs its compute actions one at a time in
//! timetable order, and a comm stream, which runs its sends one at a time in timetable order.
//! A compute action starts when its stream is free and its inputs are there; a send starts
//! when its stream is free and its data is computed, and takes `latency + bytes / bandwidth`.
//! Receives are posted early: they cost the receiver nothing but the wait for the data.
//! With host costs in the cost model ([`host`]), the timetable is lowered as the named runtime
//! lowers it, and posting each message, taking each action and the runtime's own ops take
//! time on the compute stream.
//!
//! Because every resource serves its actions in a fixed order, one pass over the actions in
//! dependency order gives the same times a discrete-event simulation with a clock would, in
//! time linear in the number of actions.

mod cost;
mod hand_off;
pub mod host;
mod measure;
mod options;
mod report;
mod request;
mod steady;

pub use cost::{overlap_time, CostError, CostModel, RawCostFile, RawStageCost, StageCost};
pub use hand_off::{hand_offs, measured_latency, HandOff};
pub use host::{CallCosts, HostCosts, HostError, Runtime};
pub use measure::{measured_costs, measured_costs_with};
pub use options::{CostOptions, CostSource};
pub use report::{DeviceReport, Report};
pub use request::{check_steps, SimulateRequest, SimulateRequestError, Simulated, MAX_STEPS};
pub use steady::{
    largest_span, period_of_starts, simulate_steps, split_steps, steady_period, step_starts,
    Bubbles, SteadyError, SteadyReport, SteadyState,
};

use host::HostPlan;
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::timeline::{Event, Timeline, TimelineMeta, TimelineSource};
use pipewright_schedule::timetable::{LowerError, Timetable};
use pipewright_schedule::validate::ValidationError;
use pipewright_schedule::Checked;
use std::borrow::Cow;

/// A simulated step: what ran when, and the figures that summarise it.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// Every compute and comm event.
    pub timeline: Timeline,
    /// Makespan, bubbles, memory.
    pub report: Report,
}

/// Why a timetable could not be simulated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The timetable is not valid.
    #[error("invalid timetable: {0}")]
    Invalid(#[from] ValidationError),
    /// Lowering failed.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The costs do not fit the timetable.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The timetable cannot be lowered as the costs' runtime lowers it.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// Lower `tt` if needed, and simulate one step of it under `costs`.
pub fn simulate(tt: &Checked, costs: &CostModel) -> Result<Simulation, SimError> {
    let (tt, host) = prepare(tt, costs)?;
    let events = Engine::new(&tt, costs, None, host.as_ref()).run();
    let timeline = Timeline {
        meta: meta(&tt),
        events,
    };
    let report = Report::new(&timeline, costs);
    Ok(Simulation { timeline, report })
}

/// Check that `costs` cover `tt`, and lower it if needed: as the costs' runtime does, with
/// its host time, when they have host costs.
fn prepare<'t>(
    tt: &'t Checked,
    costs: &CostModel,
) -> Result<(Cow<'t, Timetable>, Option<HostPlan>), SimError> {
    let stages = tt.num_stages();
    if costs.stages.len() < stages as usize {
        return Err(CostError::ModelStages {
            given: costs.stages.len(),
            stages,
        }
        .into());
    }
    costs.check_totals(stages, u64::from(tt.microbatches))?;
    if let Some(host) = costs.host {
        let (lowered, plan) = HostPlan::new(tt, host)?;
        return Ok((Cow::Owned(lowered), Some(plan)));
    }
    Ok(match tt.lowered()? {
        Cow::Borrowed(low) => (Cow::Borrowed(low.timetable()), None),
        Cow::Owned(low) => (Cow::Owned(low.into_timetable()), None),
    })
}

/// What a simulated timeline of `tt` is of.
fn meta(tt: &Timetable) -> TimelineMeta {
    TimelineMeta {
        schedule: tt.name.clone(),
        devices: tt.num_devices(),
        stages: tt.num_stages(),
        microbatches: tt.microbatches,
        source: TimelineSource::Simulated,
        time_unit: "units".to_string(),
    }
}

const UNKNOWN: f64 = f64::NAN;

struct Engine<'a> {
    tt: &'a Timetable,
    costs: &'a CostModel,
    m: usize,
    /// End of F per (stage, microbatch).
    f_end: Vec<f64>,
    /// End of the input-gradient backward (B or I) per (stage, microbatch).
    back_end: Vec<f64>,
    /// Arrival of the forward input of (stage, microbatch) from the previous device.
    in_f: Vec<f64>,
    /// Arrival of the output gradient of (stage, microbatch) from the next device.
    in_b: Vec<f64>,
    compute_free: Vec<f64>,
    comm_free: Vec<f64>,
    /// Step boundaries of a multi-step run (see `steady.rs`).
    steps: Option<steady::Boundaries>,
    /// Host time on the compute stream, when the costs have it.
    host: Option<&'a HostPlan>,
    pc: Vec<usize>,
    queued: Vec<bool>,
    queue: Vec<u32>,
    events: Vec<Event>,
}

impl<'a> Engine<'a> {
    fn new(
        tt: &'a Timetable,
        costs: &'a CostModel,
        steps: Option<steady::Boundaries>,
        host: Option<&'a HostPlan>,
    ) -> Self {
        let keys = tt.num_stages() as usize * tt.microbatches as usize;
        let n = tt.devices.len();
        Engine {
            tt,
            costs,
            m: tt.microbatches as usize,
            f_end: vec![UNKNOWN; keys],
            back_end: vec![UNKNOWN; keys],
            in_f: vec![UNKNOWN; keys],
            in_b: vec![UNKNOWN; keys],
            compute_free: vec![0.0; n],
            comm_free: vec![0.0; n],
            steps,
            host,
            pc: vec![0; n],
            queued: vec![true; n],
            queue: (0..n as u32).rev().collect(),
            events: Vec::with_capacity(tt.len()),
        }
    }

    fn key(&self, stage: u32, mb: u32) -> usize {
        stage as usize * self.m + mb as usize
    }

    fn dev(&self, stage: u32) -> u32 {
        self.tt.stage_device[stage as usize]
    }

    fn run(mut self) -> Vec<Event> {
        while let Some(d) = self.queue.pop() {
            self.queued[d as usize] = false;
            while let Some(&a) = self.tt.devices[d as usize].get(self.pc[d as usize]) {
                let (di, pc) = (d as usize, self.pc[d as usize]);
                if let Some(b) = self.steps.as_mut() {
                    b.enter(di, pc, &mut self.compute_free[di]);
                }
                let free = self.compute_free[di];
                if let Some(h) = self.host {
                    self.compute_free[di] += h.before(di, pc);
                }
                if !self.step(d, a) {
                    // Not yet: its host time is charged when it runs.
                    self.compute_free[di] = free;
                    break;
                }
                if let (Some(b), Some(e)) = (self.steps.as_mut(), self.events.last()) {
                    b.done(di, pc, e, self.costs);
                }
                self.pc[d as usize] += 1;
            }
        }
        self.events
    }

    fn wake(&mut self, d: u32) {
        if !self.queued[d as usize] {
            self.queued[d as usize] = true;
            self.queue.push(d);
        }
    }

    /// Time `a` on device `d`; false if it must wait for another device first.
    fn step(&mut self, d: u32, a: Action) -> bool {
        use ActionKind::*;
        let k = self.key(a.stage, a.microbatch);
        match a.kind {
            F | B | I | W | R | Overlap { .. } => self.compute(d, a),
            SendF => {
                let (ready, to) = (self.f_end[k], self.key(a.stage + 1, a.microbatch));
                let end = self.send(d, a, ready);
                self.in_f[to] = end;
                self.wake(self.dev(a.stage + 1));
            }
            SendB => {
                let (ready, to) = (self.back_end[k], self.key(a.stage - 1, a.microbatch));
                let end = self.send(d, a, ready);
                self.in_b[to] = end;
                self.wake(self.dev(a.stage - 1));
            }
            RecvF | RecvB => {
                let (arrival, from) = if a.kind == RecvF {
                    (self.in_f[k], a.stage - 1)
                } else {
                    (self.in_b[k], a.stage)
                };
                if arrival.is_nan() {
                    return false;
                }
                if let Some(h) = self.host {
                    // Posted on the compute stream; the compute that needs it waits.
                    let start = self.compute_free[d as usize];
                    let end = start + h.costs.recv;
                    self.compute_free[d as usize] = end;
                    self.push(d, a, start, end);
                    return true;
                }
                let start = arrival - self.costs.transfer_time(from);
                self.push(d, a, start, arrival);
            }
        }
        true
    }

    fn push(&mut self, device: u32, action: Action, start: f64, end: f64) {
        self.events.push(Event {
            device,
            action,
            start,
            end,
        });
    }

    fn send(&mut self, d: u32, a: Action, ready: f64) -> f64 {
        let from = if a.kind == ActionKind::SendF {
            a.stage
        } else {
            a.stage - 1
        };
        if let Some(h) = self.host {
            // Posted on the compute stream once the data is made; it travels from there.
            let start = self.compute_free[d as usize].max(ready);
            let posted = start + h.costs.send;
            self.compute_free[d as usize] = posted;
            self.push(d, a, start, posted);
            let leaves = self.comm_free[d as usize].max(posted);
            let end = leaves + self.costs.transfer_time(from);
            self.comm_free[d as usize] = end;
            return end;
        }
        let start = self.comm_free[d as usize].max(ready);
        let end = start + self.costs.transfer_time(from);
        self.comm_free[d as usize] = end;
        self.push(d, a, start, end);
        end
    }

    /// When the inputs of simple compute action `a` on device `d` are there.
    fn input_of(&self, d: u32, a: Action) -> f64 {
        use ActionKind::*;
        let (s, mb) = (a.stage, a.microbatch);
        let k = self.key(s, mb);
        let last = s + 1 == self.tt.num_stages();
        match a.kind {
            F if s == 0 => 0.0,
            F if self.dev(s - 1) == d => self.f_end[self.key(s - 1, mb)],
            F => self.in_f[k],
            W => self.back_end[k],
            // A recompute needs only its own forward, done earlier on this device.
            R => self.f_end[k],
            _ if last => self.f_end[k],
            _ if self.dev(s + 1) == d => self.back_end[self.key(s + 1, mb)].max(self.f_end[k]),
            _ => self.in_b[k].max(self.f_end[k]),
        }
    }

    fn compute(&mut self, d: u32, a: Action) {
        let input = a.parts().map(|p| self.input_of(d, p)).fold(0.0, f64::max);
        // Taking the action is host work, done while any input is still on its way.
        let taken = self.compute_free[d as usize] + self.host.map_or(0.0, |h| h.costs.action);
        let start = taken.max(input);
        let end = start + self.costs.duration(a);
        self.compute_free[d as usize] = end;
        for part in a.parts() {
            let k = self.key(part.stage, part.microbatch);
            match part.kind {
                ActionKind::F => self.f_end[k] = end,
                ActionKind::B | ActionKind::I => self.back_end[k] = end,
                _ => {}
            }
        }
        self.push(d, a, start, end);
    }
}
