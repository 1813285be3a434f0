//! The runtime is generic over the tensor type: the reference GPT behind a tensor type of its
//! own (`Boxed`, standing in for a device tensor), over the in-process transport with a data
//! plane of its own (`BoxedOps`), trains to the same bits as the host run. This is the path a
//! GPU stage takes (`CudaTensor`, `CudaOps`), exercised on the CPU.

use pipewright_kernels::gpt::StageOutput;
use pipewright_kernels::layers::{TpReduce, TpShard};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{KernelError, Shaped, Tensor};
use pipewright_runtime::comm::CommError;
use pipewright_runtime::{
    gpt_data, run_local, train_gpt, Coord, GptModule, HostOps, LocalOps, Mesh, MicrobatchData,
    ModuleError, ReduceOp, RunOptions, StageModule, TokenBatch, TrainConfig, Zero,
};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

/// A tensor the runtime has never heard of.
#[derive(Debug)]
struct Boxed(Box<Tensor>);

// A device tensor knows its shape without a download.
impl Shaped for Boxed {
    fn shape(&self) -> &[usize] {
        self.0.shape()
    }
}

/// A message in transit (on a GPU: a tensor and its ready event).
struct Parcel(Tensor);

/// Moves `Boxed` tensors by delegating to the host data plane.
#[derive(Default)]
struct BoxedOps;

fn refs<'a>(parts: &[&'a Parcel]) -> Vec<&'a Tensor> {
    parts.iter().map(|p| &p.0).collect()
}

impl LocalOps for BoxedOps {
    type Tensor = Boxed;
    type Message = Parcel;

    fn outgoing(&self, t: Boxed) -> Result<Parcel, CommError> {
        Ok(Parcel(*t.0))
    }

    fn incoming(&self, m: Parcel) -> Result<Boxed, CommError> {
        Ok(Boxed(Box::new(m.0)))
    }

    fn duplicate(&self, t: &Boxed) -> Result<Parcel, CommError> {
        Ok(Parcel((*t.0).clone()))
    }

    fn reduce(&self, parts: &[&Parcel], op: ReduceOp) -> Result<Boxed, CommError> {
        HostOps.reduce(&refs(parts), op).map(|t| Boxed(Box::new(t)))
    }

    fn gather(&self, parts: &[&Parcel]) -> Result<Vec<Boxed>, CommError> {
        let all = HostOps.gather(&refs(parts))?;
        Ok(all.into_iter().map(|t| Boxed(Box::new(t))).collect())
    }

    fn share(&self, whole: &Boxed, pos: usize, n: usize) -> Result<Boxed, CommError> {
        HostOps.share(&whole.0, pos, n).map(|t| Boxed(Box::new(t)))
    }

    fn concat(&self, parts: &[&Parcel], numel: usize) -> Result<Boxed, CommError> {
        HostOps
            .concat(&refs(parts), numel)
            .map(|t| Boxed(Box::new(t)))
    }

    fn numel(&self, t: &Boxed) -> usize {
        t.0.numel()
    }

    fn placeholder(&self) -> Result<Boxed, CommError> {
        Ok(Boxed(Box::new(Tensor::zeros(&[0]))))
    }
}

/// The TP all-reduce the host layers call, over the runtime's `Boxed` one.
struct Unbox<'a>(&'a mut dyn TpReduce<Boxed>);

impl TpReduce for Unbox<'_> {
    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), KernelError> {
        let mut b = Boxed(Box::new(std::mem::replace(t, Tensor::zeros(&[0]))));
        self.0.all_reduce_sum(&mut b)?;
        *t = *b.0;
        Ok(())
    }
}

/// The reference GPT stage, speaking `Boxed`.
struct BoxedGpt(GptModule);

fn boxed(out: StageOutput) -> StageOutput<Boxed> {
    match out {
        StageOutput::Hidden(t) => StageOutput::Hidden(Boxed(Box::new(t))),
        StageOutput::Loss(l) => StageOutput::Loss(l),
    }
}

impl StageModule for BoxedGpt {
    type Tensor = Boxed;
    type Data = TokenBatch;
    type Stash = <GptModule as StageModule>::Stash;
    type WeightStash = <GptModule as StageModule>::WeightStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, TokenBatch>,
        input: Option<Boxed>,
        tp: &mut dyn TpReduce<Boxed>,
    ) -> Result<(StageOutput<Boxed>, Self::Stash), ModuleError> {
        let (out, stash) = self.0.forward(mb, input.map(|b| *b.0), &mut Unbox(tp))?;
        Ok((boxed(out), stash))
    }

    fn backward_input(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Boxed>,
        tp: &mut dyn TpReduce<Boxed>,
    ) -> Result<(Option<Boxed>, Self::WeightStash), ModuleError> {
        let (g, ws) = self
            .0
            .backward_input(stash, grad_out.map(|b| *b.0), &mut Unbox(tp))?;
        Ok((g.map(|t| Boxed(Box::new(t))), ws))
    }

    fn backward_weight(&mut self, ws: Self::WeightStash) -> Result<(), ModuleError> {
        self.0.backward_weight(ws)
    }

    fn flat_grads(&mut self) -> Result<Option<Boxed>, ModuleError> {
        Ok(self.0.flat_grads()?.map(|t| Boxed(Box::new(t))))
    }

    fn set_flat_grads(&mut self, grads: Boxed) -> Result<(), ModuleError> {
        self.0.set_flat_grads(*grads.0)
    }

    // Its gradients are not host tensors: without this the NaN check refuses the run.
    fn non_finite_grad(&mut self) -> Result<Option<f32>, ModuleError> {
        self.0.non_finite_grad()
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.optimizer_step(cfg)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        self.0.flat_params()
    }

    fn shards_optimizer(&self) -> bool {
        true
    }

    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: std::ops::Range<usize>,
        grads: Boxed,
    ) -> Result<Boxed, ModuleError> {
        let t = self.0.optimizer_step_shard(cfg, range, *grads.0)?;
        Ok(Boxed(Box::new(t)))
    }

    fn set_flat_params(&mut self, values: Boxed) -> Result<(), ModuleError> {
        self.0.set_flat_params(*values.0)
    }
}

/// Under ZeRO-1 too (its reduce-scatter, sharded step and all-gather of shards through the
/// user's data plane): the bits of the host run without ZeRO.
#[test]
fn a_tensor_type_of_its_own_trains_to_the_host_runs_bits() {
    let mesh = Mesh::new(2, 2, 2).unwrap();
    let cfg = TrainConfig {
        mesh,
        model: pipewright_kernels::gpt::GptConfig::new(16, 8, 16, 2, 4),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 5,
        run: RunOptions {
            steps: 3,
            ..RunOptions::default()
        },
    };
    let tt = generate(&ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 2, 2, 4, None).unwrap());
    let mut want = Vec::new();
    let want_params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        want.push(s.loss.map(f32::to_bits))
    })
    .unwrap();

    let stages = tt.num_stages() as usize;
    let make = |c: Coord, stage: u32, _: &BoxedOps| -> Result<BoxedGpt, ModuleError> {
        let shard = TpShard::new(c.tp, mesh.tp)?;
        let m = GptModule::new(&cfg.model, cfg.seed, stage as usize, stages, shard)?;
        Ok(BoxedGpt(m))
    };
    for zero in [Zero::Off, Zero::One] {
        let opts = RunOptions {
            zero,
            ..cfg.run.clone()
        };
        let mut got = Vec::new();
        let got_params = run_local(
            mesh,
            &Checked::new(tt.clone()).unwrap(),
            |_| Ok(BoxedOps),
            make,
            |id| Ok(gpt_data(&cfg, id)),
            &opts,
            |s| got.push(s.loss.map(f32::to_bits)),
        )
        .unwrap();
        assert_eq!(got, want, "{zero:?}");
        assert_eq!(got_params, want_params, "{zero:?}");
    }
}

/// A stage of device-like tensors with gradients (`flat_grads`) but no `non_finite_grad`:
/// the default cannot read its gradients.
struct Unreadable {
    last: bool,
}

impl StageModule for Unreadable {
    type Tensor = Boxed;
    type Data = ();
    type Stash = ();
    type WeightStash = ();

    fn forward(
        &mut self,
        _: &MicrobatchData<'_>,
        _: Option<Boxed>,
        _: &mut dyn TpReduce<Boxed>,
    ) -> Result<(StageOutput<Boxed>, ()), ModuleError> {
        let out = match self.last {
            true => StageOutput::Loss(1.0),
            false => StageOutput::Hidden(Boxed(Box::new(Tensor::zeros(&[2])))),
        };
        Ok((out, ()))
    }

    fn backward_input(
        &mut self,
        _: (),
        _: Option<Boxed>,
        _: &mut dyn TpReduce<Boxed>,
    ) -> Result<(Option<Boxed>, ()), ModuleError> {
        Ok((Some(Boxed(Box::new(Tensor::zeros(&[2])))), ()))
    }

    fn backward_weight(&mut self, _: ()) -> Result<(), ModuleError> {
        Ok(())
    }

    fn flat_grads(&mut self) -> Result<Option<Boxed>, ModuleError> {
        Ok(Some(Boxed(Box::new(Tensor::zeros(&[3])))))
    }

    fn optimizer_step(&mut self, _: &AdamWConfig) -> Result<(), ModuleError> {
        Ok(())
    }
}

/// The NaN check (on by default) refuses, before the first step and naming the stage and the
/// method, gradients it cannot read; with the check off the same stages run.
#[test]
fn the_nan_check_refuses_gradients_it_cannot_read() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 2, None).unwrap());
    let train = |check_finite: bool| {
        let opts = RunOptions {
            check_finite,
            ..RunOptions::default()
        };
        let make = |_: Coord, s: u32, _: &BoxedOps| Ok(Unreadable { last: s == 1 });
        let mut steps = 0;
        let r = run_local(
            Mesh::new(2, 1, 1).unwrap(),
            &Checked::new(tt.clone()).unwrap(),
            |_| Ok(BoxedOps),
            make,
            |_| Ok(()),
            &opts,
            |_| steps += 1,
        );
        (steps, r)
    };
    let (steps, r) = train(true);
    let e = r.unwrap_err();
    let line = e.to_string();
    assert!(
        matches!(
            e,
            pipewright_runtime::RuntimeError::Module {
                method: "non_finite_grad",
                ..
            }
        ),
        "{line}"
    );
    assert!(
        line.contains("non_finite_grad") && line.contains("check_finite"),
        "{line}"
    );
    assert_eq!(steps, 0);
    let (steps, r) = train(false);
    r.unwrap();
    assert_eq!(steps, 1);
}
