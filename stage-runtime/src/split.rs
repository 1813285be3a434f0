//! A model as an ordered list of layers, cut into pipeline stages (DeepSpeed's
//! `PipelineModule` with its `partition_method`): [`Layer`] is what a user implements per
//! layer, [`split`] cuts `p * v` contiguous stages by count, by parameters or by measured
//! time (a short profiling pass, [`profile`]), and [`LayerStage`] runs a stage's layers as a
//! [`StageModule`]. A profile becomes a cost file for `pipewright search --costs`
//! ([`cost_file`]), and with each layer's parameters and bytes ([`measure`]) a layer
//! profile for `pipewright plan --profile` ([`layer_profile`]).

use std::any::Any;
use std::fmt;
use std::ops::Range;

use pipewright_kernels::layers::{Parameters, TpReduce};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{params, Footprint, Tensor};
use pipewright_schedule::{RawCostFile, RawStageCost, Recompute};

mod profile;
pub use profile::{layer_profile, measure, profile, LayerMeasure};

use crate::host::{self, HostAdamW};
use crate::module::{MicrobatchData, ModuleError, Output, StageModule};

/// One layer of a user's model on host tensors, with a split backward; its parameters are
/// the kernels' [`Parameters`] (`#[derive(Parameters)]` writes their visit for a layer built
/// of the kernels' layers). What it keeps between passes is its own types, counted by their
/// [`Footprint`] for the runtime's measured memory and the profile:
///
/// ```
/// use pipewright_runtime::split::Layer;
/// use pipewright_runtime::{Footprint, ModuleError, Param, Parameters, Tensor};
///
/// #[derive(Footprint)] // its bytes: the sum of its fields'
/// struct Kept { x: Tensor }
///
/// struct Identity;
///
/// impl Parameters for Identity {
///     fn visit(&self, _: &mut dyn FnMut(&Param)) {}
///     fn visit_mut(&mut self, _: &mut dyn FnMut(&mut Param)) {}
/// }
///
/// impl Layer for Identity {
///     type Stash = Kept;
///     type WeightStash = ();
///     fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Kept), ModuleError> {
///         Ok((x.clone(), Kept { x: x.clone() }))
///     }
///     fn backward_input(&mut self, _: Kept, dy: &Tensor) -> Result<(Tensor, ()), ModuleError> {
///         Ok((dy.clone(), ()))
///     }
///     fn backward_weight(&mut self, _: ()) -> Result<(), ModuleError> {
///         Ok(())
///     }
/// }
/// assert_eq!(Kept { x: Tensor::zeros(&[2, 3]) }.bytes(), 24);
/// ```
///
/// A stash whose bytes are not known does not compile (it would count as 0 bytes):
///
/// ```compile_fail,E0277
/// use pipewright_runtime::split::Layer;
/// use pipewright_runtime::{ModuleError, Param, Parameters, Tensor};
///
/// struct Kept { x: Tensor } // no Footprint
///
/// struct Identity;
///
/// impl Parameters for Identity {
///     fn visit(&self, _: &mut dyn FnMut(&Param)) {}
///     fn visit_mut(&mut self, _: &mut dyn FnMut(&mut Param)) {}
/// }
///
/// impl Layer for Identity {
///     type Stash = Kept;
///     type WeightStash = ();
///     fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Kept), ModuleError> {
///         Ok((x.clone(), Kept { x: x.clone() }))
///     }
///     fn backward_input(&mut self, _: Kept, dy: &Tensor) -> Result<(Tensor, ()), ModuleError> {
///         Ok((dy.clone(), ()))
///     }
///     fn backward_weight(&mut self, _: ()) -> Result<(), ModuleError> {
///         Ok(())
///     }
/// }
/// ```
///
/// `#[derive(Parameters)]` visits the fields its `#[parameters(..)]` lists, in that order; a
/// field left out is marked `#[parameters(skip)]` if it holds parameters (a frozen layer):
///
/// ```
/// use pipewright_kernels::layers::{LayerNorm, Linear};
/// use pipewright_runtime::Parameters;
///
/// #[derive(Parameters)]
/// #[parameters(norm, lin)]
/// struct Residual {
///     norm: LayerNorm,
///     lin: Linear,
///     #[parameters(skip)] // frozen: never stepped, never reduced over replicas
///     frozen: Linear,
///     relu: bool, // holds no parameters: nothing to say
/// }
/// ```
///
/// A field that holds parameters, neither listed nor skipped, does not compile (its weights
/// would never train): the error names `FieldHoldsParametersListItOrMarkItSkip` at its type.
///
/// ```compile_fail,E0283
/// use pipewright_kernels::layers::{LayerNorm, Linear};
/// use pipewright_runtime::Parameters;
///
/// #[derive(Parameters)]
/// #[parameters(norm)]
/// struct Residual {
///     norm: LayerNorm,
///     lin: Linear,
/// }
/// ```
pub trait Layer: Parameters {
    /// What the forward keeps for the input backward.
    type Stash: Footprint + 'static;
    /// What the input backward keeps for the weight backward.
    type WeightStash: Footprint + 'static;

    /// Forward: the output and what the input backward needs.
    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Self::Stash), ModuleError>;
    /// Input backward (I): the input gradient and what the weight backward needs.
    fn backward_input(
        &mut self,
        stash: Self::Stash,
        dy: &Tensor,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError>;
    /// Weight backward (W): accumulate the parameters' gradients.
    fn backward_weight(&mut self, stash: Self::WeightStash) -> Result<(), ModuleError>;
}

/// A stash of some layer, its type erased so that layers of different types share a list,
/// with its bytes counted from its type when it was made.
pub struct LayerStash {
    value: Box<dyn Any>,
    bytes: usize,
}

impl LayerStash {
    fn new<T: Footprint + 'static>(value: T) -> Self {
        let bytes = value.bytes();
        LayerStash {
            value: Box::new(value),
            bytes,
        }
    }

    fn take<T: 'static>(self) -> Result<T, ModuleError> {
        match self.value.downcast::<T>() {
            Ok(v) => Ok(*v),
            Err(_) => Err("a layer was given another layer's stash".into()),
        }
    }
}

impl Footprint for LayerStash {
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A [`Layer`] of any stash types, as a list of layers holds it (`Box<dyn DynLayer>`): every
/// `Layer` is one, so `Box::new(my_layer)` goes wherever a [`BoxedLayer`] is asked for.
pub trait DynLayer: Parameters {
    /// [`Layer::forward`], its stash erased.
    fn forward_dyn(&mut self, x: &Tensor) -> Result<(Tensor, LayerStash), ModuleError>;
    /// [`Layer::backward_input`] of a stash of this layer's forward.
    fn backward_input_dyn(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
    ) -> Result<(Tensor, LayerStash), ModuleError>;
    /// [`Layer::backward_weight`] of a stash of this layer's input backward.
    fn backward_weight_dyn(&mut self, stash: LayerStash) -> Result<(), ModuleError>;
}

impl<L: Layer> DynLayer for L {
    fn forward_dyn(&mut self, x: &Tensor) -> Result<(Tensor, LayerStash), ModuleError> {
        let (y, s) = self.forward(x)?;
        Ok((y, LayerStash::new(s)))
    }

    fn backward_input_dyn(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
    ) -> Result<(Tensor, LayerStash), ModuleError> {
        let (dx, ws) = self.backward_input(stash.take()?, dy)?;
        Ok((dx, LayerStash::new(ws)))
    }

    fn backward_weight_dyn(&mut self, stash: LayerStash) -> Result<(), ModuleError> {
        self.backward_weight(stash.take()?)
    }
}

/// A layer of a list of layers.
pub type BoxedLayer = Box<dyn DynLayer>;

/// How [`split`] balances the stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Equal layer counts (differing by at most one).
    Uniform,
    /// Equal parameter counts, as near as contiguous cuts allow.
    Parameters,
    /// Equal forward + backward time, measured by [`profile`] with this many repeats.
    Time {
        /// Passes per layer; the median is kept.
        repeats: usize,
    },
}

/// Why a list of layers cannot be split or profiled.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// Fewer layers than stages (every stage needs one).
    #[error("cannot cut {layers} layers into {stages} stages: every stage needs a layer")]
    TooFewLayers {
        /// Layers given.
        layers: usize,
        /// Stages asked for.
        stages: usize,
    },
    /// A layer failed during the profiling pass.
    #[error("profiling layer {layer}: {message}")]
    Profile {
        /// The layer's index in the list.
        layer: usize,
        /// What it said.
        message: String,
    },
    /// Balancing by time needs a sample input.
    #[error("balancing by time needs a sample input for the profiling pass")]
    NoSample,
}

/// Median milliseconds of one layer's forward, input backward and weight backward.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerCost {
    /// Forward.
    pub f: f64,
    /// Input backward (I).
    pub i: f64,
    /// Weight backward (W).
    pub w: f64,
}

/// Where the cuts are: stage `k` holds layers `stages[k]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// Contiguous layer ranges, one per stage, covering every layer in order.
    pub stages: Vec<Range<usize>>,
    /// The weight of each layer that was balanced (1 each, parameters, or milliseconds).
    pub weights: Vec<f64>,
    /// How.
    pub balance: Balance,
}

impl Partition {
    /// The summed weight of each stage.
    pub fn loads(&self) -> Vec<f64> {
        self.stages
            .iter()
            .map(|r| self.weights[r.clone()].iter().sum())
            .collect()
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.balance {
            Balance::Uniform => "layers",
            Balance::Parameters => "parameters",
            Balance::Time { .. } => "ms",
        };
        for (k, (r, load)) in self.stages.iter().zip(self.loads()).enumerate() {
            writeln!(
                f,
                "stage {k}: layers {}..{} ({load:.4} {unit})",
                r.start, r.end
            )?;
        }
        Ok(())
    }
}

/// Cut `layers` into `stages` contiguous stages balanced by `balance`. Balancing by time
/// runs [`profile`] on `sample` (the first layer's input) and leaves the gradients zero.
pub fn split(
    layers: &mut [BoxedLayer],
    stages: usize,
    balance: Balance,
    sample: Option<&Tensor>,
) -> Result<Partition, SplitError> {
    let weights: Vec<f64> = match balance {
        Balance::Uniform => vec![1.0; layers.len()],
        Balance::Parameters => layers.iter().map(|l| l.num_params() as f64).collect(),
        Balance::Time { repeats } => profile(layers, sample.ok_or(SplitError::NoSample)?, repeats)?
            .iter()
            .map(|c| c.f + c.i + c.w)
            .collect(),
    };
    let ranges = if balance == Balance::Uniform {
        uniform(layers.len(), stages)?
    } else {
        balanced(&weights, stages)?
    };
    Ok(Partition {
        stages: ranges,
        weights,
        balance,
    })
}

/// The cuts of a model of `n` layers into `stages` stages, without building the whole model:
/// `layer(k)` builds layer `k` when the balance needs it (by parameters: to count them; by
/// time: to profile it on the previous layer's output, `sample` being the first layer's
/// input), and it is dropped before the next is built. Equal to [`split`] of the whole list.
pub fn cut(
    n: usize,
    stages: usize,
    balance: Balance,
    sample: Option<&Tensor>,
    layer: impl Fn(usize) -> Result<BoxedLayer, ModuleError>,
) -> Result<Partition, SplitError> {
    check_counts(n, stages)?;
    let build = |k: usize| {
        layer(k).map_err(|e| SplitError::Profile {
            layer: k,
            message: format!("building it: {e}"),
        })
    };
    let weights: Vec<f64> = match balance {
        Balance::Uniform => vec![1.0; n],
        Balance::Parameters => (0..n)
            .map(|k| Ok(build(k)?.num_params() as f64))
            .collect::<Result<_, SplitError>>()?,
        Balance::Time { repeats } => {
            let mut x = sample.ok_or(SplitError::NoSample)?.clone();
            let mut w = Vec::with_capacity(n);
            for k in 0..n {
                let (m, y) = profile::measure_one(k, &mut *build(k)?, &x, repeats)?;
                w.push(m.cost.f + m.cost.i + m.cost.w);
                x = y;
            }
            w
        }
    };
    let ranges = if balance == Balance::Uniform {
        uniform(n, stages)?
    } else {
        balanced(&weights, stages)?
    };
    Ok(Partition {
        stages: ranges,
        weights,
        balance,
    })
}

/// `n` layers in `stages` ranges whose sizes differ by at most one.
pub fn uniform(n: usize, stages: usize) -> Result<Vec<Range<usize>>, SplitError> {
    check_counts(n, stages)?;
    Ok((0..stages)
        .map(|k| k * n / stages..(k + 1) * n / stages)
        .collect())
}

/// Contiguous non-empty ranges of `weights` whose largest sum is the least possible (exact,
/// by dynamic programming over cut points: `stages * n^2` steps, for lists of layers); the
/// cut `pipewright plan --profile` assumes ([`pipewright_schedule::layer_profile::balanced`]).
pub fn balanced(weights: &[f64], stages: usize) -> Result<Vec<Range<usize>>, SplitError> {
    check_counts(weights.len(), stages)?;
    pipewright_schedule::layer_profile::balanced(weights, stages).ok_or(SplitError::TooFewLayers {
        layers: weights.len(),
        stages,
    })
}

fn check_counts(layers: usize, stages: usize) -> Result<(), SplitError> {
    if stages == 0 || layers < stages {
        return Err(SplitError::TooFewLayers { layers, stages });
    }
    Ok(())
}

/// A cost file of the partition's stages (each the sum of its layers' profiled times, in
/// ms) for `pipewright search --costs` or `simulate --costs`.
pub fn cost_file(profile: &[LayerCost], partition: &[Range<usize>]) -> RawCostFile {
    let stages = partition
        .iter()
        .map(|r| {
            let sum = |pick: fn(&LayerCost) -> f64| profile[r.clone()].iter().map(pick).sum();
            let (i, w): (f64, f64) = (sum(|c| c.i), sum(|c| c.w));
            RawStageCost {
                f: Some(sum(|c| c.f)),
                b: Some(i + w),
                i: Some(i),
                w: Some(w),
                ..RawStageCost::default()
            }
        })
        .collect();
    RawCostFile {
        stages: Some(stages),
        time_unit: Some("ms".into()),
        source: Some("pipewright_runtime::split::profile".into()),
        ..RawCostFile::default()
    }
}

/// The loss of a model's last layer's output against a microbatch's data, and its gradient,
/// both multiplied by the loss scale (the third argument, `1 / (dp * m)`): the runtime sums
/// the scaled losses and gradients of the global batch's `dp * m` microbatches, which is the
/// global batch's mean.
pub type LossFn<D> = dyn Fn(&Tensor, &D, f32) -> Result<(f32, Tensor), ModuleError>;

/// The first stage's input from a microbatch's data.
pub type InputFn<D> = dyn Fn(&D) -> Result<Tensor, ModuleError>;

/// One stage of a layer-list model: its layers, the model's input function on the first
/// stage and its loss on the last, AdamW over its parameters. It offers full recomputation
/// (its layers' forwards run again from the kept stage input, so they must give the same
/// result twice, as a forward without dropout or other hidden state does); a layer's stash
/// is its own opaque type, so selective recomputation is not offered.
pub struct LayerStage<D> {
    /// In order; their parameters are visited in that order.
    layers: Vec<BoxedLayer>,
    input: Option<Box<InputFn<D>>>,
    loss: Option<Box<LossFn<D>>>,
    opt: HostAdamW,
    full_recompute: bool,
}

/// What a [`LayerStage`]'s forward keeps for its backward.
#[derive(pipewright_kernels::Footprint)]
pub struct LayerStageStash {
    layers: Vec<LayerStash>,
    loss_grad: Option<Tensor>,
    /// The stage's input, kept alone under full recomputation (`None` on the first stage,
    /// whose input the data rebuilds).
    input: Option<Tensor>,
    #[footprint(skip)]
    slim: bool,
}

impl<D> LayerStage<D> {
    /// A stage of `layers`; `input` for the first stage, `loss` for the last (both for a
    /// model of one stage).
    pub fn new(
        layers: Vec<BoxedLayer>,
        input: Option<Box<InputFn<D>>>,
        loss: Option<Box<LossFn<D>>>,
    ) -> Self {
        LayerStage {
            layers,
            input,
            loss,
            opt: HostAdamW::default(),
            full_recompute: false,
        }
    }

    /// Stage `stage` of a model cut at `cuts` (from [`cut`] or [`split`]): its layers built by
    /// `layer(k)`, the model's `input` function if it is the first stage and its `loss` if it
    /// is the last. A run's `make` closure is then `|_, s| LayerStage::part(&cuts, s, layer,
    /// input, loss)`, and `part(&[0..n], 0, ..)` is the whole model on one device.
    pub fn part<I, L>(
        cuts: &[Range<usize>],
        stage: u32,
        layer: impl Fn(usize) -> Result<BoxedLayer, ModuleError>,
        input: I,
        loss: L,
    ) -> Result<Self, ModuleError>
    where
        I: Fn(&D) -> Result<Tensor, ModuleError> + 'static,
        L: Fn(&Tensor, &D, f32) -> Result<(f32, Tensor), ModuleError> + 'static,
    {
        let range = cuts
            .get(stage as usize)
            .ok_or_else(|| format!("stage {stage} is not one of the {} cuts", cuts.len()))?;
        let last = cuts.last().map_or(0, |r| r.end);
        let layers = range.clone().map(layer).collect::<Result<_, _>>()?;
        let input = (range.start == 0).then(|| Box::new(input) as Box<InputFn<D>>);
        let loss = (range.end == last).then(|| Box::new(loss) as Box<LossFn<D>>);
        Ok(LayerStage::new(layers, input, loss))
    }

    /// The forward, keeping every layer's stash (`keep`) or none of them.
    fn run_forward(
        &mut self,
        mb: &MicrobatchData<'_, D>,
        input: Option<Tensor>,
        keep: bool,
    ) -> Result<(Output, LayerStageStash), ModuleError> {
        let mut x = match (input, &self.input) {
            (Some(x), _) => x,
            (None, Some(f)) => f(mb.data)?,
            (None, None) => return Err("a first stage needs an input function".into()),
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &mut self.layers {
            let (y, s) = layer.forward_dyn(&x)?;
            if keep {
                layers.push(s);
            }
            x = y;
        }
        let mut stash = LayerStageStash {
            layers,
            loss_grad: None,
            input: None,
            slim: !keep,
        };
        match &self.loss {
            Some(loss) => {
                let (l, grad) = loss(&x, mb.data, mb.loss_scale)?;
                stash.loss_grad = keep.then_some(grad);
                Ok((Output::Loss(l), stash))
            }
            None => Ok((Output::Hidden(x), stash)),
        }
    }
}

impl<D> StageModule for LayerStage<D> {
    type Tensor = Tensor;
    type Data = D;
    type Stash = LayerStageStash;
    type WeightStash = Vec<LayerStash>;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, D>,
        input: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, Self::Stash), ModuleError> {
        if !self.full_recompute {
            return self.run_forward(mb, input, true);
        }
        let kept = input.clone();
        let (out, mut stash) = self.run_forward(mb, input, false)?;
        stash.input = kept;
        Ok((out, stash))
    }

    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        match policy {
            Recompute::None | Recompute::Full => {
                self.full_recompute = policy == Recompute::Full;
                Ok(())
            }
            Recompute::Selective | Recompute::Every(_) => Err(
                "a layer-list stage recomputes only fully (its layers' stashes are opaque)".into(),
            ),
        }
    }

    fn recompute(
        &mut self,
        mb: &MicrobatchData<'_, D>,
        stash: LayerStageStash,
        _: &mut dyn TpReduce,
    ) -> Result<LayerStageStash, ModuleError> {
        if !stash.slim {
            return Ok(stash);
        }
        Ok(self.run_forward(mb, stash.input, true)?.1)
    }

    fn backward_input(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
        if stash.slim {
            return Err("the stash was not recomputed before the backward".into());
        }
        let stashes = stash.layers;
        let mut dy = grad_out.or(stash.loss_grad).ok_or("no output gradient")?;
        let mut ws = Vec::with_capacity(stashes.len());
        for (layer, s) in self.layers.iter_mut().zip(stashes).rev() {
            let (dx, w) = layer.backward_input_dyn(s, &dy)?;
            ws.push(w);
            dy = dx;
        }
        Ok((Some(dy), ws))
    }

    fn backward_weight(&mut self, ws: Self::WeightStash) -> Result<(), ModuleError> {
        let layers = self.layers.iter_mut().rev();
        layers
            .zip(ws)
            .try_for_each(|(layer, w)| layer.backward_weight_dyn(w))
    }

    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.layers)
    }

    fn set_flat_grads(&mut self, grads: Tensor) -> Result<(), ModuleError> {
        host::set_flat_grads(&mut self.layers, grads)
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.opt.step(&mut self.layers, cfg)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        host::flat_params(&self.layers)
    }

    fn shards_optimizer(&self) -> bool {
        true
    }

    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: Tensor,
    ) -> Result<Tensor, ModuleError> {
        self.opt.step_shard(&mut self.layers, cfg, range, grads)
    }

    fn set_flat_params(&mut self, values: Tensor) -> Result<(), ModuleError> {
        host::set_flat_params(&mut self.layers, values)
    }

    fn optimizer_state_bytes(&self) -> usize {
        self.opt.state_bytes()
    }

    fn parameter_bytes(&self) -> usize {
        params::storage_bytes(&self.layers).0
    }

    fn gradient_bytes(&self) -> usize {
        params::storage_bytes(&self.layers).1
    }
}
