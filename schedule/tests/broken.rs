//! Hand-broken timetables are each rejected with the right error, naming where.

use pipewright_schedule::{
    from_csv, generate, lower, validate, validate_with, Action, ActionKind, Problem, ScheduleKind,
    ScheduleSpec, Semantics, Timetable, ValidationError,
};

fn lowered_1f1b(p: u32, m: u32) -> Timetable {
    lower(&generate(
        &ScheduleSpec::new(ScheduleKind::OneFOneB, p, 1, m, None).unwrap(),
    ))
    .unwrap()
}

fn csv(text: &str) -> Timetable {
    from_csv(text).unwrap().0
}

fn err(tt: &Timetable) -> ValidationError {
    validate(tt).expect_err("should be rejected")
}

fn pos(tt: &Timetable, device: usize, action: &str) -> usize {
    let a: Action = action.parse().unwrap();
    tt.devices[device].iter().position(|&x| x == a).unwrap()
}

#[test]
fn missing_receive_names_the_receive_and_the_consumer() {
    let mut tt = lowered_1f1b(2, 2);
    let i = pos(&tt, 1, "1RECV_F1");
    tt.devices[1].remove(i);
    let e = err(&tt);
    assert!(
        matches!(e.problem, Problem::MissingRecv { from: 0, .. }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "device 1, step {i} (1F1): needs 1RECV_F1 before it: its input comes from device 0"
        )
    );
    assert!(e.grid(&tt).contains(">1F1<"), "{}", e.grid(&tt));
}

#[test]
fn send_placed_after_a_receive_that_needs_it_deadlocks() {
    // Device 0 waits for the gradient of microbatch 0 before sending microbatch 0 forward.
    let tt = csv("0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
    let e = err(&tt);
    let Problem::Deadlock(waits) = &e.problem else {
        panic!("{e}")
    };
    assert_eq!(waits.len(), 2, "{e}");
    assert_eq!(
        e.to_string(),
        "device 0, step 1 (0RECV_B0): deadlock: device 0 step 1 (0RECV_B0) waits for 1SEND_B0 on device 1; \
         device 1 step 0 (1RECV_F0) waits for 0SEND_F0 on device 0"
    );
}

#[test]
fn crossed_sends_run_buffered_but_deadlock_under_rendezvous() {
    // Steady 1F1B: device 0 sends a forward while device 1 sends a backward to it.
    let tt = lowered_1f1b(2, 4);
    assert!(validate(&tt).is_ok());
    let e = validate_with(&tt, Semantics::Rendezvous).expect_err("rendezvous deadlock");
    assert!(matches!(e.problem, Problem::Deadlock(_)), "{e}");
}

#[test]
fn duplicated_forward_points_at_the_first_copy() {
    let e = err(&csv("0F0,0F1,0F0,0B0,0B1\n"));
    assert_eq!(e.problem, Problem::Duplicate { first_step: 0 });
    assert!(
        e.to_string()
            .starts_with("device 0, step 2 (0F0): duplicated"),
        "{e}"
    );
}

#[test]
fn w_before_its_i_is_rejected() {
    let e = err(&csv("0F0,0W0,0I0\n"));
    assert!(
        matches!(e.problem, Problem::WBeforeI { i_step: 2, .. }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "device 0, step 1 (0W0): W before its I 0I0 (step 2)"
    );
}

#[test]
fn backward_before_its_forward_is_rejected() {
    let e = err(&csv("0F0,0F1,0B1,0B0\n1B0,1F0,1F1,1B1\n"));
    assert!(
        matches!(
            e.problem,
            Problem::BackwardBeforeForward {
                forward_step: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().starts_with("device 1, step 0 (1B0)"), "{e}");
}

#[test]
fn missing_backward_and_half_split_backwards_are_named() {
    let e = err(&csv("0F0\n"));
    assert_eq!(
        e.to_string(),
        "device 0: stage 0 microbatch 0 has no backward (B, or I and W)"
    );
    assert!(matches!(err(&csv("0F0,0I0\n")).problem, Problem::MissingW));
    assert!(matches!(err(&csv("0F0,0W0\n")).problem, Problem::WWithoutI));
    assert!(matches!(
        err(&csv("0F0,0B0,0I0,0W0\n")).problem,
        Problem::BothBackwards { .. }
    ));
}

#[test]
fn dependency_across_devices_that_can_never_be_met_is_a_deadlock() {
    // Compute-only: stage 1 runs its backward for microbatch 1 before its forward for 0,
    // which stage 0 sends only after it got that backward... a cycle across devices.
    let tt = csv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
    let e = err(&tt);
    assert!(matches!(e.problem, Problem::Deadlock(_)), "{e}");
    assert!(
        e.to_string()
            .contains("device 1 step 0 (1F1) waits for 0F1 on device 0"),
        "{e}"
    );
}

#[test]
fn misplaced_and_needless_comm_actions_are_rejected() {
    let e = err(&csv("0F0,0B0,0SEND_F0\n"));
    assert!(matches!(e.problem, Problem::NoPeer(_)), "{e}");
    let mut tt = lowered_1f1b(2, 1);
    tt.devices[0].push(Action::new(1, ActionKind::F, 0));
    assert!(matches!(
        err(&tt).problem,
        Problem::WrongDevice { stage: 1, owner: 1 }
    ));
    tt.devices[0].pop();
    tt.devices[0].push(Action::new(0, ActionKind::F, 7));
    assert!(matches!(
        err(&tt).problem,
        Problem::NoSuchMicrobatch { microbatch: 7, .. }
    ));
}

#[test]
fn send_before_its_producer_is_rejected() {
    let e = err(&csv(
        "0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
    ));
    assert!(
        matches!(
            e.problem,
            Problem::SendBeforeProducer {
                producer_step: 1,
                ..
            }
        ),
        "{e}"
    );
}
