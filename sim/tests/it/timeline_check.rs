//! What `Timeline::check` refuses, on timelines the simulator wrote and then edited.
use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
use pipewright_schedule::Checked;
use pipewright_schedule::{Timeline, TimelineError};
use pipewright_sim::simulate::{simulate, simulate_steps, CostModel, StageCost};

fn simulated() -> Timeline {
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 3, None).unwrap();
    let tt = Checked::new(pipewright_schedule::generate(&spec)).unwrap();
    let costs = CostModel::uniform(2, StageCost::new(1.0, 2.0, None).unwrap());
    simulate(&tt, &costs).unwrap().timeline
}

fn edited(f: impl FnOnce(&mut Timeline)) -> TimelineError {
    let mut tl = simulated();
    f(&mut tl);
    tl.check().unwrap_err()
}

fn first_of(tl: &Timeline, kind: ActionKind, device: u32) -> usize {
    tl.events
        .iter()
        .position(|e| e.action.kind == kind && e.device == device)
        .unwrap()
}

#[test]
fn what_the_simulator_writes_passes_one_step_or_many() {
    simulated().check().unwrap();
    let spec = ScheduleSpec::new(ScheduleKind::Zbv, 2, 2, 4, None).unwrap();
    let tt = Checked::new(pipewright_schedule::generate(&spec)).unwrap();
    let costs = CostModel::uniform(4, StageCost::new(1.0, 2.0, Some(1.0)).unwrap());
    simulate_steps(&tt, &costs, 3)
        .unwrap()
        .timeline
        .check()
        .unwrap();
}

#[test]
fn contradictions_are_refused_naming_the_event() {
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::B, 0);
        tl.events[i].end = tl.events[i].start - 1.0;
    });
    assert!(e.to_string().contains("before it starts"), "{e}");
    let e = edited(|tl| tl.events.clear());
    assert_eq!(e, TimelineError::NoEvents);
    let e = edited(|tl| tl.events[0].action.microbatch = 7);
    assert!(e.to_string().contains("microbatch 7 does not exist"), "{e}");
    let e = edited(|tl| tl.events[0].action.stage = 9);
    assert!(e.to_string().contains("stage 9 does not exist"), "{e}");
    let e = edited(|tl| tl.events[0].start = f64::NAN);
    assert!(e.to_string().contains("finite"), "{e}");
    // A duplicated event: the same forward twice.
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::F, 0);
        let mut again = tl.events[i];
        again.start += 100.0;
        again.end += 100.0;
        tl.events.push(again);
    });
    assert!(e.to_string().contains("duplicated"), "{e}");
    // Two computations at once on one device.
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::B, 1);
        tl.events[i].start -= 0.5;
    });
    assert!(matches!(e, TimelineError::Overlap { device: 1, .. }), "{e}");
    // An event missing: the step is incomplete.
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::B, 1);
        tl.events.remove(i);
    });
    assert!(e.to_string().contains("no backward"), "{e}");
    let e = edited(|tl| tl.meta.microbatches = 100_000_000);
    assert!(e.to_string().contains("missing"), "{e}");
    let e = edited(|tl| tl.meta.devices = 0);
    assert!(matches!(e, TimelineError::Meta { .. }), "{e}");
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::F, 0);
        tl.events[i].action = Action::new(1, ActionKind::F, 0);
    });
    assert!(
        matches!(e, TimelineError::TwoDevices { stage: 1, .. }),
        "{e}"
    );
}

/// A simulated timeline whose forward starts before the previous stage's forward of that
/// microbatch has ended (each device's own order still valid) is refused; so is a backward
/// that starts before the next stage's backward has handed it its gradient.
#[test]
fn a_stage_that_uses_what_another_has_not_made_yet_is_refused() {
    // 1F1B on 2 devices: device 1's first forward starts when device 0's ends.
    let e = edited(|tl| {
        let i = first_of(tl, ActionKind::F, 1);
        let d = tl.events[i].end - tl.events[i].start;
        tl.events[i].start -= 0.5;
        tl.events[i].end = tl.events[i].start + d;
    });
    assert!(
        matches!(
            &e,
            TimelineError::Causality {
                device: 1,
                from: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("1F0 starts at 0.5, before 0F0"),
        "{e}"
    );
    // Device 0's last backward moved before device 1's last backward ends: shift all
    // of device 0's events after its first backward earlier would break its own order,
    // so move device 1's last backward later instead.
    let e = edited(|tl| {
        let last = tl
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action.kind == ActionKind::B && e.device == 1)
            .max_by(|a, b| a.1.start.total_cmp(&b.1.start))
            .map(|(i, _)| i)
            .unwrap();
        tl.events[last].start += 50.0;
        tl.events[last].end += 50.0;
    });
    assert!(
        matches!(
            &e,
            TimelineError::Causality {
                device: 0,
                from: 1,
                ..
            }
        ),
        "{e}"
    );
    // Measured timelines come from clocks that agree only to within a barrier: not held
    // to it.
    let mut tl = simulated();
    let i = first_of(&tl, ActionKind::F, 1);
    tl.events[i].start -= 0.5;
    tl.events[i].end -= 0.5;
    tl.meta.source = pipewright_schedule::timeline::TimelineSource::Measured;
    tl.check().unwrap();
}
