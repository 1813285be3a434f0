//! `StageModule`: what a user implements for one chunk of a model, and two implementations:
//! the reference GPT ([`GptModule`]) and synthetic stages of exact durations ([`SyntheticModule`]).

use std::time::{Duration, Instant};

use pipewright_kernels::gpt::{
    GptConfig, GptStage, Microbatch as GptMicrobatch, StageOutput, Stash, WeightStash,
};
use pipewright_kernels::layers::{Parameters, TpReduce, TpShard};
use pipewright_kernels::Tensor;
use pipewright_schedule::StageCost;

/// A boxed error from user code.
pub type ModuleError = Box<dyn std::error::Error + Send + Sync>;

/// The data of one microbatch, as every stage sees it.
#[derive(Clone, Copy, Debug)]
pub struct MicrobatchData<'a> {
    /// Microbatch index within the step.
    pub index: u32,
    /// Input token ids (`batch * seq`), read by the first stage.
    pub tokens: &'a [u32],
    /// Target ids, read by the last stage.
    pub targets: &'a [u32],
    /// Tokens per sequence.
    pub seq: usize,
    /// Multiplies the loss and its gradient (1 / microbatches in the global batch).
    pub loss_scale: f32,
}

/// What a stage's forward produces.
pub type Output = StageOutput;

/// One chunk of a model on one device (and one TP rank). The runtime owns everything around
/// it: stashing per microbatch, hand-offs, gradient reduction, the optimizer step.
pub trait StageModule {
    /// What forward keeps for the input backward.
    type Stash;
    /// What the input backward keeps for the weight backward.
    type WeightStash;

    /// Forward of one microbatch; `input` is `None` on the first stage.
    fn forward(
        &mut self,
        mb: &MicrobatchData<'_>,
        input: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Output, Self::Stash), ModuleError>;

    /// Input-gradient backward (I); `grad_out` is `None` on the last stage. Returns the
    /// gradient for the previous stage (`None` on the first).
    fn backward_input(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, Self::WeightStash), ModuleError>;

    /// Weight-gradient backward (W): accumulate into the gradients.
    fn backward_weight(&mut self, stash: Self::WeightStash) -> Result<(), ModuleError>;

    /// Full backward (B): I then W.
    fn backward(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<Option<Tensor>, ModuleError> {
        let (g, ws) = self.backward_input(stash, grad_out, tp)?;
        self.backward_weight(ws)?;
        Ok(g)
    }

    /// Trainable parameters and their gradients, if the stage has any.
    fn parameters(&mut self) -> Option<&mut dyn Parameters>;
}

/// One stage (and TP shard) of the reference GPT.
pub struct GptModule {
    /// The kernels' stage.
    pub stage: GptStage,
}

impl GptModule {
    /// Stage `stage` of `stages`, TP shard `tp`, initialised from `seed`.
    pub fn new(
        cfg: &GptConfig,
        seed: u64,
        stage: usize,
        stages: usize,
        tp: TpShard,
    ) -> Result<Self, ModuleError> {
        Ok(GptModule {
            stage: GptStage::new(cfg, seed, stage, stages, tp)?,
        })
    }
}

impl StageModule for GptModule {
    type Stash = Stash;
    type WeightStash = WeightStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_>,
        input: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Output, Stash), ModuleError> {
        let gmb = GptMicrobatch {
            tokens: mb.tokens,
            targets: mb.targets,
            seq: mb.seq,
            loss_scale: mb.loss_scale,
        };
        Ok(self.stage.forward(&gmb, input, tp)?)
    }

    fn backward_input(
        &mut self,
        stash: Stash,
        grad_out: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, WeightStash), ModuleError> {
        Ok(self.stage.backward_input(stash, grad_out, tp)?)
    }

    fn backward_weight(&mut self, ws: WeightStash) -> Result<(), ModuleError> {
        Ok(self.stage.backward_weight(ws)?)
    }

    fn parameters(&mut self) -> Option<&mut dyn Parameters> {
        Some(&mut self.stage)
    }
}

/// A stage that takes exact durations and computes nothing, the way a GPU kernel occupies its
/// stream while the host waits: for measuring the runtime's own overhead against the simulator.
#[derive(Clone, Debug)]
pub struct SyntheticModule {
    /// Forward time.
    pub f: Duration,
    /// Input-backward time.
    pub i: Duration,
    /// Weight-backward time.
    pub w: Duration,
    /// Elements of the activation handed to the next stage.
    pub activation: usize,
    /// Whether this is the last stage (it returns a loss).
    pub last: bool,
}

impl SyntheticModule {
    /// A stage taking `cost`'s F, I and W times read as milliseconds (negative times as
    /// zero), handing one element onward; `last` returns a loss.
    pub fn from_cost_ms(cost: &StageCost, last: bool) -> Self {
        let ms = |x: f64| Duration::from_secs_f64(x.max(0.0) / 1e3);
        SyntheticModule {
            f: ms(cost.f),
            i: ms(cost.i),
            w: ms(cost.w),
            activation: 1,
            last,
        }
    }
}

/// Wait until `d` has passed: sleep most of it, spin the last few microseconds. Spinning
/// longer would steal the core from other devices' threads when there are more devices than
/// cores, which a GPU kernel never does.
fn occupy(d: Duration) {
    precise_sleeps();
    let end = Instant::now() + d;
    let spin = Duration::from_micros(30);
    if d > spin {
        std::thread::sleep(d - spin);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Linux lets a sleeping thread oversleep by its timer slack (50 us by default); set it to
/// 1 ns once per thread so synthetic durations are exact.
pub(crate) fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    {
        thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        DONE.with(|done| {
            if !done.replace(true) {
                // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only this thread.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            }
        });
    }
}

impl StageModule for SyntheticModule {
    type Stash = ();
    type WeightStash = ();

    fn forward(
        &mut self,
        _: &MicrobatchData<'_>,
        _: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, ()), ModuleError> {
        occupy(self.f);
        let out = if self.last {
            StageOutput::Loss(0.0)
        } else {
            StageOutput::Hidden(Tensor::zeros(&[self.activation]))
        };
        Ok((out, ()))
    }

    fn backward_input(
        &mut self,
        _: (),
        _: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, ()), ModuleError> {
        occupy(self.i);
        Ok((Some(Tensor::zeros(&[self.activation])), ()))
    }

    fn backward_weight(&mut self, _: ()) -> Result<(), ModuleError> {
        occupy(self.w);
        Ok(())
    }

    fn parameters(&mut self) -> Option<&mut dyn Parameters> {
        None
    }
}
