//! A failure anywhere stops every rank with one error naming rank, action and microbatch.

use pipewright_schedule::Checked;
use std::time::{Duration, Instant};

use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::Tensor;
use pipewright_runtime::{
    run, Coord, Mesh, MicrobatchData, ModuleError, RunOptions, RuntimeError, StageModule,
    SyntheticModule,
};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

#[derive(Clone, Copy)]
enum Fault {
    Error,
    Panic,
    Stall(Duration),
}

/// A synthetic stage that misbehaves on one microbatch's forward.
struct Faulty {
    inner: SyntheticModule,
    fault: Option<(u32, Fault)>,
}

impl StageModule for Faulty {
    type Tensor = Tensor;
    type Data = ();
    type Stash = ();
    type WeightStash = ();

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_>,
        x: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(pipewright_runtime::module::Output, ()), ModuleError> {
        match self.fault {
            Some((m, Fault::Error)) if m == mb.index => return Err("injected failure".into()),
            Some((m, Fault::Panic)) if m == mb.index => panic!("injected panic"),
            Some((m, Fault::Stall(d))) if m == mb.index => std::thread::sleep(d),
            _ => {}
        }
        self.inner.forward(mb, x, tp)
    }

    fn backward_input(
        &mut self,
        s: (),
        g: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, ()), ModuleError> {
        self.inner.backward_input(s, g, tp)
    }

    fn backward_weight(&mut self, s: ()) -> Result<(), ModuleError> {
        self.inner.backward_weight(s)
    }
}

/// Run 1F1B on 4 devices with `fault` at `stage`'s forward of microbatch 2; return the error,
/// the number of steps every rank finished, and how long it took.
fn run_with(stage: u32, fault: Fault, timeout: Duration) -> (RuntimeError, usize, Duration) {
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 4, None).unwrap();
    let make = |_: Coord, s: u32| {
        let inner = SyntheticModule {
            f: Duration::ZERO,
            i: Duration::ZERO,
            w: Duration::ZERO,
            activation: 4,
            last: s == 3,
        };
        Ok(Faulty {
            inner,
            fault: (s == stage).then_some((2, fault)),
        })
    };
    let data = |_| Ok(());
    let opts = RunOptions {
        steps: 2,
        timeout,
        ..RunOptions::default()
    };
    let mut finished = 0;
    let t0 = Instant::now();
    let err = run(
        Mesh::new(4, 1, 1).unwrap(),
        &Checked::new(generate(&spec)).unwrap(),
        make,
        data,
        &opts,
        |_| finished += 1,
    )
    .unwrap_err();
    (err, finished, t0.elapsed())
}

#[test]
fn a_stage_error_names_rank_action_and_microbatch() {
    let (e, finished, _) = run_with(2, Fault::Error, Duration::from_secs(10));
    assert_eq!(
        e.to_string(),
        "rank 2 (pp 2, tp 0, dp 0), step 0, action 2F2 (microbatch 2): injected failure"
    );
    assert_eq!(finished, 0, "no rank got past the failing step");
}

#[test]
fn a_stage_panic_becomes_the_same_kind_of_error() {
    let (e, finished, _) = run_with(1, Fault::Panic, Duration::from_secs(10));
    assert_eq!(e.to_string(), "rank 1 (pp 1, tp 0, dp 0), step 0, action 1F2 (microbatch 2): stage panicked: injected panic");
    assert_eq!(finished, 0);
}

#[test]
fn a_receive_that_never_arrives_times_out_and_stops_everyone() {
    // Stage 0 stalls on microbatch 2 for far longer than the receive timeout.
    let (e, finished, took) = run_with(
        0,
        Fault::Stall(Duration::from_millis(1500)),
        Duration::from_millis(300),
    );
    // Every device downstream waits for microbatch 2; whichever began waiting first reports.
    let RuntimeError::Device {
        rank,
        action: Some(a),
        ..
    } = &e
    else {
        panic!("{e}")
    };
    let text = e.to_string();
    let want = format!(
        "rank {rank} (pp {rank}, tp 0, dp 0), step 0, action {rank}RECV_F2 (microbatch 2): timed out after 0.3 s \
         waiting for activation of stage {} microbatch 2 (step 0) from rank {}",
        rank - 1,
        rank - 1
    );
    assert_eq!((a.stage as usize, text), (*rank, want));
    assert_eq!(finished, 0);
    // Everyone is stopped once the stalled stage returns; nobody waits for another timeout.
    assert!(took < Duration::from_millis(1500 + 1000), "{took:?}");
}
