//! A timeline checked as strictly as a timetable before anything is drawn or measured
//! from it: every event inside the numbers its `meta` gives, none starting before 0, no
//! event ending before it starts, no two computations at once on one device, and the compute events, taken in
//! time order per device, a valid timetable (complete, each action once, in dependency
//! order), and, in a simulated one, no stage starting on what another stage has not made
//! yet (a forward before the previous stage's forward of its microbatch has ended, a
//! backward before the next stage's). A timeline the simulator or the runtime wrote always
//! passes; a hand-edited or corrupted one is refused naming its first bad event.

use std::collections::HashMap;

use super::{Event, Timeline};
use crate::timetable::Timetable;
use crate::validate::{validate, ValidationError};

/// Most devices a timeline may name: per-device figures allocate by this count.
pub const MAX_DEVICES: u32 = 1 << 16;

/// Why a timeline cannot be trusted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TimelineError {
    /// Counts outside what any run has.
    #[error("meta says {devices} devices and {stages} stages: expected 1 to {MAX_DEVICES} devices and at least one stage per device")]
    Meta {
        /// `meta.devices`.
        devices: u32,
        /// `meta.stages`.
        stages: u32,
    },
    /// Nothing happened.
    #[error("the timeline has no events")]
    NoEvents,
    /// More devices than computations: some device did nothing.
    #[error("meta says {devices} devices, but the timeline has {compute} compute events: every device of a step computes")]
    Idle {
        /// `meta.devices`.
        devices: u32,
        /// Compute events.
        compute: usize,
    },
    /// An event outside the numbers of `meta`, or with a time that is not a number.
    #[error("event {index} ({what}): {why}")]
    BadEvent {
        /// Position in `events`.
        index: usize,
        /// The event, as `device 1: 2F3 at 4..5`.
        what: String,
        /// What is wrong.
        why: String,
    },
    /// Two computations at once on one device.
    #[error("device {device}: {second} starts at {start}, before {first} ends at {end}: one device computes one thing at a time")]
    Overlap {
        /// Device.
        device: u32,
        /// The earlier action.
        first: String,
        /// Its end.
        end: f64,
        /// The action that starts inside it.
        second: String,
        /// Its start.
        start: f64,
    },
    /// A stage whose events run on two devices.
    #[error(
        "stage {stage} runs on device {first} and on device {second}: a stage lives on one device"
    )]
    TwoDevices {
        /// Stage.
        stage: u32,
        /// The device of its first event.
        first: u32,
        /// Another.
        second: u32,
    },
    /// A stage of `meta` with no event at all.
    #[error("stage {0} has no events")]
    NoStage(u32),
    /// The compute events in time order are not a valid timetable.
    #[error("its compute in time order is not a valid step: {0}")]
    Invalid(ValidationError),
    /// A computation that starts before what it takes from another stage has been made.
    #[error("device {device}: {action} starts at {start}, before {needs} (what it takes from stage {from}) ends at {end}: a stage cannot use what another has not made yet")]
    Causality {
        /// Device of the action.
        device: u32,
        /// The action.
        action: String,
        /// Its start.
        start: f64,
        /// The action it takes its input from.
        needs: String,
        /// That action's stage.
        from: u32,
        /// That action's end.
        end: f64,
    },
}

fn show(e: &Event) -> String {
    format!(
        "device {}: {} at {}..{}",
        e.device, e.action, e.start, e.end
    )
}

/// A timeline of another pipeline than the first of a set measured together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timeline {index} is not of timeline 0's pipeline: its {field} is {got}, timeline 0's is {want}")]
pub struct OtherPipeline {
    /// Its place in the set.
    pub index: usize,
    /// The `meta` field that differs: schedule, devices, stages or microbatches.
    pub field: &'static str,
    /// Its value there.
    pub got: String,
    /// The first timeline's.
    pub want: String,
}

/// Timelines whose steps are pooled (measured costs are medians over them) are of one
/// pipeline: the same schedule, devices, stages and microbatches as the first.
pub fn same_pipeline(timelines: &[&Timeline]) -> Result<(), OtherPipeline> {
    let Some(first) = timelines.first() else {
        return Ok(());
    };
    let fields = |m: &super::TimelineMeta| {
        [
            ("schedule", m.schedule.clone()),
            ("devices", m.devices.to_string()),
            ("stages", m.stages.to_string()),
            ("microbatches", m.microbatches.to_string()),
        ]
    };
    let want = fields(&first.meta);
    for (index, tl) in timelines.iter().enumerate().skip(1) {
        for ((field, got), (_, want)) in fields(&tl.meta).into_iter().zip(want.iter()) {
            if got != *want {
                return Err(OtherPipeline {
                    index,
                    field,
                    got,
                    want: want.clone(),
                });
            }
        }
    }
    Ok(())
}

impl Timeline {
    /// Check the timeline (see the module's text); `Ok` with nothing changed.
    pub fn check(&self) -> Result<(), TimelineError> {
        let meta = &self.meta;
        if meta.devices == 0 || meta.devices > MAX_DEVICES || meta.stages < meta.devices {
            return Err(TimelineError::Meta {
                devices: meta.devices,
                stages: meta.stages,
            });
        }
        if self.events.is_empty() {
            return Err(TimelineError::NoEvents);
        }
        // Every device computes: per-device tables are then bounded by the events.
        let compute = self.compute_events().count();
        if meta.devices as usize > compute {
            return Err(TimelineError::Idle {
                devices: meta.devices,
                compute,
            });
        }
        for (index, e) in self.events.iter().enumerate() {
            if let Some(why) = event_problem(self, e) {
                return Err(TimelineError::BadEvent {
                    index,
                    what: show(e),
                    why,
                });
            }
        }
        let tt = self.compute_timetable()?;
        no_overlap(self)?;
        validate(&tt).map_err(TimelineError::Invalid)?;
        // The simulator times every action after its inputs from other stages; a measured
        // timeline's devices may run on clocks that agree only to within a barrier, so only
        // a simulated one is held to this exactly.
        if meta.source == super::TimelineSource::Simulated {
            causal(self)?;
        }
        Ok(())
    }

    /// The compute events as a timetable: each device's in time order, stages placed where
    /// their events run.
    fn compute_timetable(&self) -> Result<Timetable, TimelineError> {
        let meta = &self.meta;
        let mut rows: Vec<Vec<&Event>> = vec![Vec::new(); meta.devices as usize];
        let mut placed: HashMap<u32, u32> = HashMap::new();
        for e in self.compute_events() {
            rows[e.device as usize].push(e);
            for part in e.action.parts() {
                match placed.insert(part.stage, e.device) {
                    Some(d) if d != e.device => {
                        return Err(TimelineError::TwoDevices {
                            stage: part.stage,
                            first: d,
                            second: e.device,
                        })
                    }
                    _ => {}
                }
            }
        }
        // Every stage named in `meta` has an event (so `meta.stages` is bounded by them).
        if let Some(s) = (0..meta.stages).find(|s| !placed.contains_key(s)) {
            return Err(TimelineError::NoStage(s));
        }
        let stage_device = (0..meta.stages).map(|s| placed[&s]).collect();
        let devices = rows
            .into_iter()
            .map(|mut row| {
                row.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.end.total_cmp(&b.end)));
                row.into_iter().map(|e| e.action).collect()
            })
            .collect();
        Ok(Timetable {
            name: meta.schedule.clone(),
            microbatches: meta.microbatches,
            stage_device,
            devices,
        })
    }
}

/// What is wrong with one event on its own, if anything.
fn event_problem(tl: &Timeline, e: &Event) -> Option<String> {
    let meta = &tl.meta;
    if !(e.start.is_finite() && e.end.is_finite()) {
        return Some("its times must be finite numbers".into());
    }
    // Times count from the step's start: an event before it would stretch the step (and its
    // bubble) by a time nothing ran in.
    if e.start < 0.0 {
        return Some(format!(
            "it starts at {}, before the step's start at 0",
            e.start
        ));
    }
    if e.end < e.start {
        return Some(format!(
            "it ends at {} before it starts at {}",
            e.end, e.start
        ));
    }
    if e.device >= meta.devices {
        return Some(format!("meta says {} devices", meta.devices));
    }
    for a in e.action.parts() {
        if a.stage >= meta.stages {
            return Some(format!(
                "stage {} does not exist (meta says {} stages)",
                a.stage, meta.stages
            ));
        }
        if a.microbatch >= meta.microbatches {
            return Some(format!(
                "microbatch {} does not exist (meta says {} microbatches)",
                a.microbatch, meta.microbatches
            ));
        }
    }
    None
}

/// No device computes two things at once (touching ends are fine; so are zero-length
/// events, and rounding of recorded times by a part in a billion).
fn no_overlap(tl: &Timeline) -> Result<(), TimelineError> {
    let mut rows: Vec<Vec<&Event>> = vec![Vec::new(); tl.meta.devices as usize];
    for e in tl.compute_events() {
        rows[e.device as usize].push(e);
    }
    for (d, mut row) in rows.into_iter().enumerate() {
        row.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.end.total_cmp(&b.end)));
        for pair in row.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let slack = 1e-9 * a.end.abs().max(1.0);
            if b.start < a.end - slack {
                return Err(TimelineError::Overlap {
                    device: d as u32,
                    first: a.action.to_string(),
                    end: a.end,
                    second: b.action.to_string(),
                    start: b.start,
                });
            }
        }
    }
    Ok(())
}

/// Every forward starts after the previous stage's forward of its microbatch has ended, and
/// every input backward (B or I) after the next stage's (the same rounding slack as
/// [`no_overlap`]). Called once the compute is known complete and each action once.
fn causal(tl: &Timeline) -> Result<(), TimelineError> {
    use crate::action::ActionKind;
    let backward = |k: ActionKind| matches!(k, ActionKind::B | ActionKind::I);
    // (stage, microbatch, is a backward) -> the event that made it.
    let mut made: HashMap<(u32, u32, bool), &Event> = HashMap::new();
    for e in tl.compute_events() {
        for a in e.action.parts() {
            if a.kind == ActionKind::F || backward(a.kind) {
                made.insert((a.stage, a.microbatch, backward(a.kind)), e);
            }
        }
    }
    for e in tl.compute_events() {
        for a in e.action.parts() {
            let from = match a.kind {
                ActionKind::F if a.stage > 0 => (a.stage - 1, a.microbatch, false),
                k if backward(k) && a.stage + 1 < tl.meta.stages => {
                    (a.stage + 1, a.microbatch, true)
                }
                _ => continue,
            };
            let Some(dep) = made.get(&from) else {
                continue;
            };
            let slack = 1e-9 * dep.end.abs().max(1.0);
            if e.start < dep.end - slack {
                return Err(TimelineError::Causality {
                    device: e.device,
                    action: e.action.to_string(),
                    start: e.start,
                    needs: dep.action.to_string(),
                    from: from.0,
                    end: dep.end,
                });
            }
        }
    }
    Ok(())
}
