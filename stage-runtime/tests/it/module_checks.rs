//! A hand-written `StageModule` cannot train wrong silently: a method whose absence would
//! change the answer is refused before the first step (or, where no probe can tell, at the
//! first call), in one line naming the stage and the method; with the methods, dp = 2
//! equals one device.

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{Linear, TpReduce};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Tensor;
use pipewright_runtime::host::{self, HostAdamW};
use pipewright_runtime::{
    run, Coord, FinalParams, Mesh, MicrobatchData, MicrobatchId, ModuleError, Output, RunOptions,
    RuntimeError, StageModule,
};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, Recompute, ScheduleKind, ScheduleSpec};

const ROWS: usize = 4;
const WIDTH: usize = 6;

type Data = (Tensor, Vec<f32>);

fn data(id: MicrobatchId) -> Result<Data, ModuleError> {
    // The same global batch every step, so the loss falls.
    let x = normal_tensor(&[ROWS, WIDTH], 1.0, 0, &format!("x{}", id.global()));
    let y = x
        .data()
        .chunks(WIDTH)
        .map(|r| r.iter().map(|v| v.sin()).sum())
        .collect();
    Ok((x, y))
}

/// Linear layers `layers` of a 4-layer chain (the last one to 1 output), MSE on the last.
struct Chain {
    layers: Vec<Linear>,
    first: bool,
    last: bool,
    opt: HostAdamW,
    fault: Fault,
}

/// A mistake a stage makes, for the boundary checks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// Its input gradient loses a row.
    ShortGrad,
    /// Its forward output loses a row from this microbatch on.
    ShortOutput(u32),
    /// Its forward output of this microbatch holds a NaN.
    NanOutput(u32),
    /// It returns a loss (of its output) though it is not the last stage.
    Loss,
    /// Its input backward returns no gradient.
    NoGrad,
}

/// The first `rows - 1` rows of `t`.
fn short(t: &Tensor) -> Tensor {
    let (r, c) = (t.shape()[0], t.shape()[1]);
    Tensor::new(&[r - 1, c], t.data()[..(r - 1) * c].to_vec()).unwrap()
}

fn chain(layers: std::ops::Range<usize>) -> Chain {
    let (first, last) = (layers.start == 0, layers.end == 4);
    let lin = |k: usize| {
        let o = if k == 3 { 1 } else { WIDTH };
        let w = normal_tensor(&[WIDTH, o], 0.4, 3, &format!("w{k}"));
        Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o]))).unwrap()
    };
    Chain {
        layers: layers.map(lin).collect(),
        first,
        last,
        opt: HostAdamW::default(),
        fault: Fault::None,
    }
}

/// Each layer's input, and the loss gradient on the last stage.
type Stash = (Vec<Tensor>, Option<Tensor>);
/// Each layer's input and output gradient.
type WeightStash = (Vec<Tensor>, Vec<Tensor>);

impl Chain {
    fn forward(
        &self,
        mb: &MicrobatchData<'_, Data>,
        x: Option<Tensor>,
    ) -> Result<(Output, Stash), ModuleError> {
        let mut x = match x {
            Some(x) => x,
            None if self.first => mb.data.0.clone(),
            None => return Err("no input".into()),
        };
        let mut inputs = Vec::new();
        for l in &self.layers {
            let y = l.forward(&x)?;
            inputs.push(std::mem::replace(&mut x, y));
        }
        match self.fault {
            Fault::ShortOutput(k) if mb.index >= k => x = short(&x),
            Fault::NanOutput(k) if mb.index == k => x.data_mut()[5] = f32::NAN,
            Fault::Loss => return Ok((Output::Loss(x.data()[0]), (inputs, None))),
            _ => {}
        }
        if !self.last {
            return Ok((Output::Hidden(x), (inputs, None)));
        }
        let s = mb.loss_scale / ROWS as f32;
        let err: Vec<f32> = x
            .data()
            .iter()
            .zip(&mb.data.1)
            .map(|(p, t)| p - t)
            .collect();
        let grad = Tensor::new(&[ROWS, 1], err.iter().map(|e| 2.0 * s * e).collect())?;
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        Ok((Output::Loss(loss), (inputs, Some(grad))))
    }

    fn backward_input(
        &self,
        (inputs, dloss): Stash,
        dy: Option<Tensor>,
    ) -> Result<(Option<Tensor>, WeightStash), ModuleError> {
        let mut dy = dy.or(dloss).ok_or("no gradient")?;
        let mut dys = Vec::new();
        for l in self.layers.iter().rev() {
            let dx = l.backward_input(&dy)?;
            dys.push(std::mem::replace(&mut dy, dx));
        }
        dys.reverse();
        match self.fault {
            Fault::ShortGrad => Ok((Some(short(&dy)), (inputs, dys))),
            Fault::NoGrad => Ok((None, (inputs, dys))),
            _ => Ok((Some(dy), (inputs, dys))),
        }
    }

    fn backward_weight(&mut self, (inputs, dys): WeightStash) -> Result<(), ModuleError> {
        for ((l, x), dy) in self.layers.iter_mut().zip(&inputs).zip(&dys) {
            l.backward_weight(x, dy)?;
        }
        Ok(())
    }
}

/// The four methods of the trial (forward, backward, optimizer step, flat
/// parameters), and the methods listed.
macro_rules! module {
    ($ty:ident $(, $extra:item)*) => {
        struct $ty(Chain);

        impl StageModule for $ty {
            type Tensor = Tensor;
            type Data = Data;
            type Stash = Stash;
            type WeightStash = WeightStash;

            fn forward(&mut self, mb: &MicrobatchData<'_, Data>, x: Option<Tensor>, _: &mut dyn TpReduce)
                -> Result<(Output, Stash), ModuleError> {
                self.0.forward(mb, x)
            }

            fn backward_input(&mut self, stash: Stash, dy: Option<Tensor>, _: &mut dyn TpReduce)
                -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
                self.0.backward_input(stash, dy)
            }

            fn backward_weight(&mut self, ws: Self::WeightStash) -> Result<(), ModuleError> {
                self.0.backward_weight(ws)
            }

            fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
                host::flat_params(&self.0.layers)
            }

            $($extra)*
        }
    };
}

module!(
    Trial,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    }
);

module!(
    NoSet,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.0.layers)
    }
);

module!(
    Claims,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        Ok(None)
    }
);

module!(
    ClaimsButCounts,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        Ok(None)
    },
    fn parameter_bytes(&self) -> usize {
        pipewright_kernels::params::storage_bytes(&self.0.layers).0
    }
);

module!(
    FirstLayerOnly,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.0.layers[0])
    },
    fn set_flat_grads(&mut self, g: Tensor) -> Result<(), ModuleError> {
        host::set_flat_grads(&mut self.0.layers[0], g)
    }
);

module!(
    IgnoresSet,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.0.layers)
    },
    fn set_flat_grads(&mut self, _: Tensor) -> Result<(), ModuleError> {
        Ok(())
    }
);

module!(NoStep);

/// Forward and backward, and its parameter bytes for the measured memory: nothing else.
struct CountsNoStep(Chain);

impl StageModule for CountsNoStep {
    type Tensor = Tensor;
    type Data = Data;
    type Stash = Stash;
    type WeightStash = WeightStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, Data>,
        x: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, Stash), ModuleError> {
        self.0.forward(mb, x)
    }

    fn backward_input(
        &mut self,
        stash: Stash,
        dy: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, WeightStash), ModuleError> {
        self.0.backward_input(stash, dy)
    }

    fn backward_weight(&mut self, ws: WeightStash) -> Result<(), ModuleError> {
        self.0.backward_weight(ws)
    }

    fn parameter_bytes(&self) -> usize {
        pipewright_kernels::params::storage_bytes(&self.0.layers).0
    }
}

module!(
    NoRecompute,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn set_recompute(&mut self, _: Recompute) -> Result<(), ModuleError> {
        Ok(())
    }
);

module!(
    Whole,
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.opt.step(&mut self.0.layers, cfg)
    },
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.0.layers)
    },
    fn set_flat_grads(&mut self, g: Tensor) -> Result<(), ModuleError> {
        host::set_flat_grads(&mut self.0.layers, g)
    }
);

fn opts(steps: u64) -> RunOptions {
    RunOptions {
        steps,
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    }
}

/// `kind` on pp = 2 (layers 0..2 and 2..4) and `dp` replicas: the losses and final
/// parameters, or the refusal.
fn train<M>(
    kind: ScheduleKind,
    pp: usize,
    dp: usize,
    m: u32,
    wrap: fn(Chain) -> M,
    opts: &RunOptions,
) -> (Vec<f32>, Result<FinalParams, RuntimeError>)
where
    M: StageModule<Tensor = Tensor, Data = Data> + 'static,
    M::Stash: 'static,
    M::WeightStash: 'static,
{
    faulty(kind, (pp, dp, m), wrap, opts, (0, Fault::None))
}

/// [`train`] with stage `fault.0` making mistake `fault.1`.
fn faulty<M>(
    kind: ScheduleKind,
    (pp, dp, m): (usize, usize, u32),
    wrap: fn(Chain) -> M,
    opts: &RunOptions,
    (at, fault): (u32, Fault),
) -> (Vec<f32>, Result<FinalParams, RuntimeError>)
where
    M: StageModule<Tensor = Tensor, Data = Data> + 'static,
    M::Stash: 'static,
    M::WeightStash: 'static,
{
    let tt = generate(&ScheduleSpec::new(kind, pp as u32, 1, m, None).unwrap());
    let per = 4 / pp;
    let make = |_: Coord, s: u32| {
        let mut c = chain(s as usize * per..(s as usize + 1) * per);
        if s == at {
            c.fault = fault;
        }
        Ok(wrap(c))
    };
    let mut losses = Vec::new();
    let r = run(
        Mesh::new(pp, 1, dp).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        data,
        opts,
        |s| losses.push(s.loss.unwrap()),
    );
    (losses, r)
}

fn refusal(e: &RuntimeError) -> (u32, &'static str, String) {
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    match e {
        RuntimeError::Module { stage, method, .. } => (*stage, *method, line),
        other => panic!("expected a refused module, got {other}"),
    }
}

#[test]
fn dp_2_refuses_a_stage_with_parameters_but_no_flat_grads_before_the_first_step() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, Trial, &opts(3));
    let e = r.expect_err("each replica would step on its own gradients");
    let (stage, method, line) = refusal(&e);
    // Both stages lack the methods; the run returns the error of the rank that failed first.
    assert!(stage < 2 && method == "flat_grads", "{line}");
    for part in [
        &*format!("stage {stage}"),
        "flat_grads",
        "set_flat_grads",
        "dp = 2",
        "own gradients",
    ] {
        assert!(line.contains(part), "{line} lacks {part}");
    }
    assert!(losses.is_empty(), "a step ran: {losses:?}");
    // One replica needs neither: the same module trains.
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 1, 4, Trial, &opts(3));
    r.unwrap();
    assert!(losses[2] < losses[0], "{losses:?}");
}

#[test]
fn dp_2_refuses_flat_grads_without_set_flat_grads_and_a_stage_that_hides_its_gradients() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, NoSet, &opts(3));
    let (stage, method, line) = refusal(&r.unwrap_err());
    assert!(stage < 2 && method == "set_flat_grads", "{line}");
    assert!(losses.is_empty());
    let (_, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, Claims, &opts(3));
    let (stage, method, line) = refusal(&r.unwrap_err());
    assert!(stage < 2 && method == "flat_grads", "{line}");
    let shown = if stage == 0 { 84 } else { 49 };
    assert!(
        line.contains(&format!("flat_params shows {shown} parameters")),
        "{line}"
    );
}

/// A module that reports its parameter bytes (so the runtime need not read its flat
/// parameters) but whose flat_grads says "no gradients", and one whose flat_grads holds only
/// some of its parameters' gradients: under dp = 2 both would train each replica on its own
/// gradients (for the parameters left out), so both are refused before the first step.
#[test]
fn dp_2_refuses_gradients_hidden_behind_parameter_bytes_or_left_out_of_flat_grads() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, ClaimsButCounts, &opts(3));
    let (stage, method, line) = refusal(&r.expect_err("replicas would diverge"));
    assert!(stage < 2 && method == "flat_grads", "{line}");
    assert!(line.contains("parameter_bytes"), "{line}");
    assert!(losses.is_empty(), "a step ran: {losses:?}");
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, FirstLayerOnly, &opts(3));
    let (stage, method, line) = refusal(&r.expect_err("replicas would diverge"));
    assert!(stage < 2 && method == "flat_grads", "{line}");
    let (params, grads) = if stage == 0 { (84, 42) } else { (49, 42) };
    assert!(
        line.contains(&format!("{grads} gradients"))
            && line.contains(&format!("{params} parameters")),
        "{line}"
    );
    assert!(losses.is_empty(), "a step ran: {losses:?}");
    // One replica reduces nothing: both train.
    train(ScheduleKind::OneFOneB, 2, 1, 4, ClaimsButCounts, &opts(1))
        .1
        .unwrap();
    train(ScheduleKind::OneFOneB, 2, 1, 4, FirstLayerOnly, &opts(1))
        .1
        .unwrap();
}

/// A set_flat_grads that sets nothing (here a stub returning `Ok(())`) would leave each
/// replica on its own gradients: refused before the first step, naming the method.
#[test]
fn dp_2_refuses_a_set_flat_grads_that_does_not_set_the_gradients() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 2, 4, IgnoresSet, &opts(3));
    let (stage, method, line) = refusal(&r.expect_err("replicas would diverge"));
    assert!(stage < 2 && method == "set_flat_grads", "{line}");
    assert!(
        line.contains("does not set what flat_grads reads"),
        "{line}"
    );
    assert!(losses.is_empty(), "a step ran: {losses:?}");
    // One replica sets no gradients: it trains.
    train(ScheduleKind::OneFOneB, 2, 1, 4, IgnoresSet, &opts(1))
        .1
        .unwrap();
}

#[test]
fn a_stage_with_parameters_and_no_optimizer_step_stops_at_the_first_step() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 1, 4, NoStep, &opts(3));
    let line = r.unwrap_err().to_string();
    assert!(
        line.contains("step 0") && line.contains("optimizer_step"),
        "{line}"
    );
    assert!(line.contains("would never change"), "{line}");
    assert!(losses.is_empty(), "{losses:?}");
}

/// Without flat views, the parameter bytes a module reports show that it has parameters:
/// the default optimizer step refuses it rather than leave its weights as they were.
#[test]
fn a_stage_that_reports_parameter_bytes_and_no_optimizer_step_stops_at_the_first_step() {
    let (losses, r) = train(ScheduleKind::OneFOneB, 2, 1, 4, CountsNoStep, &opts(3));
    let line = r.expect_err("its weights would never change").to_string();
    assert!(
        line.contains("step 0") && line.contains("optimizer_step"),
        "{line}"
    );
    assert!(line.contains("would never change"), "{line}");
    assert!(losses.is_empty(), "{losses:?}");
}

#[test]
fn a_stage_that_accepts_recomputation_but_cannot_recompute_is_named() {
    let mut o = opts(1);
    o.recompute = "full".parse().unwrap();
    let (_, r) = train(ScheduleKind::OneFOneB, 2, 1, 4, NoRecompute, &o);
    let line = r.unwrap_err().to_string();
    assert!(
        line.contains("stage 1") && line.contains("does not implement recompute"),
        "{line}"
    );
}

#[test]
fn dp_2_with_flat_grads_and_set_flat_grads_equals_one_device_under_a_split_backward() {
    let o = opts(4);
    let (piped, r) = train(ScheduleKind::ZbH1, 2, 2, 4, Whole, &o);
    let params = r.unwrap();
    let (single, r1) = train(ScheduleKind::GPipe, 1, 1, 8, Whole, &o);
    let one = r1.unwrap();
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0);
    assert_eq!(piped.len(), 4);
    for (step, (a, b)) in piped.iter().zip(&single).enumerate() {
        assert!(close(*a, *b), "step {step}: dp = 2 {a} vs one device {b}");
    }
    let flat = |p: &FinalParams| p.values().flatten().copied().collect::<Vec<f32>>();
    let (got, want) = (flat(&params), flat(&one));
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| close(*a, *b)));
    assert!(single[3] < single[0], "{single:?}");
}

/// Stage `at` of a 2-stage 1F1B run makes `fault`: the run's error.
fn mistake(at: u32, fault: Fault) -> RuntimeError {
    let (losses, r) = faulty(
        ScheduleKind::OneFOneB,
        (2, 1, 4),
        Whole,
        &opts(2),
        (at, fault),
    );
    assert!(losses.is_empty(), "{fault:?}: a step finished");
    let e = r.expect_err("a mistake at a stage boundary");
    assert!(!e.to_string().contains('\n'), "{e}");
    e
}

#[test]
fn an_input_gradient_one_row_short_is_named_at_the_stage_that_produced_it() {
    let e = mistake(1, Fault::ShortGrad);
    let line = e.to_string();
    match e {
        RuntimeError::HandOff {
            action,
            what,
            got,
            want,
            ..
        } => {
            assert_eq!((action.stage, what), (1, "input gradient"));
            assert_eq!(action.to_string(), "1B0");
            assert_eq!((&*got, &*want), (&[3, WIDTH][..], &[4, WIDTH][..]));
        }
        other => panic!("expected a hand-off error, got {other}"),
    }
    for part in [
        "rank 1",
        "action 1B0",
        "stage 1's input gradient",
        "[3, 6]",
        "[4, 6]",
    ] {
        assert!(line.contains(part), "{line} lacks {part}");
    }
}

#[test]
fn a_forward_output_whose_shape_changes_is_named_at_its_stage_and_microbatch() {
    let e = mistake(0, Fault::ShortOutput(2));
    let line = e.to_string();
    match e {
        RuntimeError::HandOff {
            action,
            what,
            got,
            want,
            ..
        } => {
            assert_eq!(
                (action.stage, what, action.to_string()),
                (0, "forward output", "0F2".into())
            );
            assert_eq!((&*got, &*want), (&[3, WIDTH][..], &[4, WIDTH][..]));
        }
        other => panic!("expected a hand-off error, got {other}"),
    }
    assert!(line.contains("hand-off to stage 1"), "{line}");
}

#[test]
fn a_nan_handed_on_is_named_at_the_stage_that_made_it() {
    match mistake(0, Fault::NanOutput(1)) {
        RuntimeError::NonFinite {
            stage,
            microbatch,
            what,
            value,
            ..
        } => {
            assert_eq!((stage, microbatch, what), (0, Some(1), "forward output"));
            assert!(value.is_nan());
        }
        other => panic!("expected a non-finite hand-off, got {other}"),
    }
}

#[test]
fn a_loss_before_the_last_stage_and_a_missing_input_gradient_are_named() {
    let line = mistake(0, Fault::Loss).to_string();
    assert!(
        line.contains("stage 0 returned a loss") && line.contains("action 0F0"),
        "{line}"
    );
    let line = mistake(1, Fault::NoGrad).to_string();
    assert!(
        line.contains("stage 1 returned no input gradient"),
        "{line}"
    );
}

/// A module that does not report its parameter and gradient bytes is counted from its flat
/// views, not as 0 bytes; its stashes by their types.
#[test]
fn unreported_sizes_are_counted_from_the_flat_views() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let make = |_: Coord, s: u32| Ok(Whole(chain(s as usize * 2..(s as usize + 1) * 2)));
    let mut memory = Vec::new();
    run(
        Mesh::new(2, 1, 1).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        data,
        &opts(1),
        |s| memory = s.memory.clone(),
    )
    .unwrap();
    // Stage 0: two 6x6 layers with biases; stage 1: a 6x6 and a 6x1 layer with biases.
    for (rank, params) in [(0, 2 * 42), (1, 42 + 7)] {
        let peak = memory[rank].peak;
        assert_eq!(
            (peak.parameters, peak.gradients),
            (4 * params, 4 * params),
            "rank {rank}"
        );
        assert!(peak.activations > 0, "rank {rank}: stashes counted");
    }
}

/// dp = 2 from a `make` whose weights differ between replicas: every replica would train its
/// own model while the run reported replica 0's.
fn replicas_differ(make: impl Fn(Coord, u32) -> Result<Whole, ModuleError> + Sync) -> String {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let mut steps = 0;
    let r = run(
        Mesh::new(2, 1, 2).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        data,
        &opts(2),
        |_| steps += 1,
    );
    assert_eq!(steps, 0, "a step ran");
    let (stage, method, line) = refusal(&r.expect_err("replicas start apart"));
    assert_eq!(method, "make", "{line}");
    assert!(
        line.starts_with(&format!("stage {stage}: data-parallel replicas 0 and 1")),
        "{line}"
    );
    line
}

#[test]
fn dp_2_refuses_replicas_that_start_from_different_weights() {
    // Weights from a generator that moves on with every call (a thread's RNG, say).
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let line = replicas_differ(|_, s| {
        let mut c = chain(s as usize * 2..(s as usize + 1) * 2);
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.layers[0].weight.value.data_mut()[0] += n as f32;
        Ok(Whole(c))
    });
    assert!(
        line.contains("stage 0") && line.contains("value 0 of the flat parameters is"),
        "{line}"
    );
    // Weights seeded by the replica: stage 1's second layer differs at its first bias value.
    let line = replicas_differ(|coord, s| {
        let mut c = chain(s as usize * 2..(s as usize + 1) * 2);
        if s == 1 {
            c.layers[1].bias.as_mut().unwrap().value.data_mut()[0] = coord.dp as f32;
        }
        Ok(Whole(c))
    });
    assert!(line.contains("stage 1"), "{line}");
}
