//! [`SyntheticModule`]: stages of exact durations that compute nothing, for measuring the
//! runtime's own overhead.

use std::time::{Duration, Instant};

use pipewright_kernels::gpt::StageOutput;
use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::Tensor;
use pipewright_schedule::Recompute;

use pipewright_comm::timer::precise_sleeps;
use pipewright_stage::split::LayerCost;

use super::{MicrobatchData, ModuleError, Output, StageModule};

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
    /// A stage taking `cost`'s F, I and W times in milliseconds (negative times as zero),
    /// e.g. a simulator `StageCost`'s, handing one element onward; `last` returns a loss.
    pub fn from_ms(cost: &LayerCost, last: bool) -> Self {
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

impl StageModule for SyntheticModule {
    type Tensor = Tensor;
    type Data = ();
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

    /// No parameters: nothing to reduce over data-parallel replicas.
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        Ok(None)
    }

    /// Full recomputation reruns the forward: it takes the forward's time again.
    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        match policy {
            Recompute::None | Recompute::Full => Ok(()),
            _ => Err("a synthetic stage recomputes only fully (it has no layers)".into()),
        }
    }

    fn recompute(
        &mut self,
        _: &MicrobatchData<'_>,
        _: (),
        _: &mut dyn TpReduce,
    ) -> Result<(), ModuleError> {
        occupy(self.f);
        Ok(())
    }
}
