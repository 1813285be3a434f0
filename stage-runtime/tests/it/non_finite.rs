//! The run's NaN check: a non-finite loss or gradient stops every rank at that step with an
//! error naming the step, rank, stage and microbatch; `check_finite: false` trains on.

use pipewright_schedule::Checked;
use std::time::{Duration, Instant};

use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Tensor;
use pipewright_runtime::{
    run, Coord, Mesh, MicrobatchData, MicrobatchId, ModuleError, Output, RunOptions, RuntimeError,
    StageModule,
};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

/// `y = w * x`, mean squared error on the last stage; `poison` makes its gradient NaN from
/// that step on (counted by its own optimizer steps), with a finite loss.
struct Scale {
    w: f32,
    grad: f32,
    last: bool,
    steps: u64,
    poison: Option<u64>,
}

type Data = (Vec<f32>, Vec<f32>);

impl StageModule for Scale {
    type Tensor = Tensor;
    type Data = Data;
    type Stash = (Tensor, Option<Tensor>);
    type WeightStash = (Tensor, Tensor);

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, Data>,
        input: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, Self::Stash), ModuleError> {
        let x = input.unwrap_or(Tensor::new(&[mb.data.0.len()], mb.data.0.clone())?);
        let y: Vec<f32> = x.data().iter().map(|v| self.w * v).collect();
        if !self.last {
            return Ok((Output::Hidden(Tensor::new(&[y.len()], y)?), (x, None)));
        }
        let s = mb.loss_scale / y.len() as f32;
        let err: Vec<f32> = y.iter().zip(&mb.data.1).map(|(y, t)| y - t).collect();
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        let grad = Tensor::new(&[y.len()], err.iter().map(|e| 2.0 * s * e).collect())?;
        Ok((Output::Loss(loss), (x, Some(grad))))
    }

    fn backward_input(
        &mut self,
        (x, dloss): Self::Stash,
        dy: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
        let dy = dy.or(dloss).ok_or("no gradient")?;
        let dx: Vec<f32> = dy.data().iter().map(|d| self.w * d).collect();
        Ok((Some(Tensor::new(&[dx.len()], dx)?), (x, dy)))
    }

    fn backward_weight(&mut self, (x, dy): Self::WeightStash) -> Result<(), ModuleError> {
        self.grad += x
            .data()
            .iter()
            .zip(dy.data())
            .map(|(x, d)| x * d)
            .sum::<f32>();
        if self.poison.is_some_and(|s| self.steps >= s) {
            self.grad = f32::NAN;
        }
        Ok(())
    }

    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        Ok(Some(Tensor::new(&[1], vec![self.grad])?))
    }

    fn set_flat_grads(&mut self, g: Tensor) -> Result<(), ModuleError> {
        self.grad = g.data()[0];
        Ok(())
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.w -= cfg.lr * self.grad;
        self.grad = 0.0;
        self.steps += 1;
        Ok(())
    }
}

/// Points of y = 2x; the target of `bad` (step, microbatch) is NaN.
fn data(bad: Option<(u64, u32)>) -> impl Fn(MicrobatchId) -> Result<Data, ModuleError> + Sync {
    move |id: MicrobatchId| {
        let x: Vec<f32> = (0..4).map(|i| (id.global() + i) as f32 / 8.0).collect();
        let mut y: Vec<f32> = x.iter().map(|x| 2.0 * x).collect();
        if bad == Some((id.step, id.microbatch)) {
            y[1] = f32::NAN;
        }
        Ok((x, y))
    }
}

/// Runs 1F1B on `p` devices and `dp` replicas for 6 steps: the steps recorded and the result.
fn train(
    dp: usize,
    check: bool,
    bad: Option<(u64, u32)>,
    poison: impl Fn(Coord, u32) -> Option<u64> + Sync,
) -> (Vec<u64>, Result<(), RuntimeError>) {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 3, 1, 4, None).unwrap());
    let opts = RunOptions {
        steps: 6,
        timeout: Duration::from_secs(60),
        adamw: AdamWConfig {
            lr: 0.1,
            ..Default::default()
        },
        check_finite: check,
        ..Default::default()
    };
    let make = |c: Coord, stage: u32| {
        Ok(Scale {
            w: 0.5,
            grad: 0.0,
            last: stage == 2,
            steps: 0,
            poison: poison(c, stage),
        })
    };
    let mut steps = Vec::new();
    let r = run(
        Mesh::new(3, 1, dp).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        data(bad),
        &opts,
        |s| steps.push(s.step),
    );
    (steps, r.map(|_| ()))
}

#[test]
fn a_nan_loss_stops_the_run_at_its_step_naming_stage_and_microbatch() {
    let t0 = Instant::now();
    let (steps, r) = train(1, true, Some((2, 1)), |_, _| None);
    let e = r.expect_err("a NaN loss must stop the run");
    match &e {
        RuntimeError::NonFinite {
            step,
            stage,
            microbatch,
            what,
            value,
            ..
        } => {
            assert_eq!((*step, *stage, *microbatch, *what), (2, 2, Some(1), "loss"));
            assert!(value.is_nan());
        }
        other => panic!("expected NonFinite, got {other}"),
    }
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    for part in ["rank 2", "step 2", "stage 2", "microbatch 1", "NaN"] {
        assert!(line.contains(part), "{line} lacks {part}");
    }
    assert!(
        steps.iter().all(|&s| s < 2),
        "steps after the NaN ran: {steps:?}"
    );
    // Every rank stopped at once: no receive waited for its timeout.
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_nan_gradient_with_a_finite_loss_stops_the_run_before_the_optimizer() {
    // Stage 0 of DP replica 1 only: the all-reduce spreads it, both replicas refuse it.
    let (steps, r) = train(2, true, None, |c, s| (s == 0 && c.dp == 1).then_some(3));
    match r {
        Err(RuntimeError::NonFinite {
            step,
            stage: 0,
            microbatch: None,
            what: "gradient",
            ..
        }) => assert_eq!(step, 3),
        other => panic!("expected a NaN gradient at step 3, stage 0: {other:?}"),
    }
    assert!(steps.iter().all(|&s| s < 3), "{steps:?}");
}

#[test]
fn with_the_check_off_the_run_trains_through() {
    let (steps, r) = train(1, false, Some((2, 1)), |_, s| (s == 1).then_some(4));
    r.expect("the check is off");
    assert_eq!(steps.len(), 6);
}
