//! A model as an ordered list of layers, cut into pipeline stages (DeepSpeed's
//! `PipelineModule` with its `partition_method`): [`Layer`] is what a user implements per
//! layer, [`split`] cuts `p * v` contiguous stages by count, by parameters or by measured
//! time (a short profiling pass, [`profile`]), and [`LayerStage`] runs a stage's layers as a
//! [`StageModule`](crate::StageModule). A profile becomes a cost file for `pipewright search --costs`
//! ([`stage_costs`], then `RawCostFile::from_stage_ms`), and with each layer's parameters and
//! bytes ([`measure`]) a layer
//! profile for `pipewright plan --profile` ([`layer_profile`]).

use std::any::Any;
use std::fmt;
use std::ops::Range;

use pipewright_kernels::layers::{Parameters, TpReduce};
use pipewright_kernels::{Footprint, Tensor};

mod library;
mod profile;
mod stage;
pub use profile::{layer_profile, layer_profile_tp, measure, profile, LayerMeasure};
pub use stage::{InputFn, LayerStage, LayerStageStash, LossFn};

use crate::module::ModuleError;

/// One layer of a user's model on host tensors, with a split backward; its parameters are
/// the kernels' [`Parameters`] (`#[derive(Parameters)]` writes their visit for a layer built
/// of the kernels' layers). What it keeps between passes is its own types, counted by their
/// [`Footprint`] for the runtime's measured memory and the profile:
///
/// ```
/// use pipewright_stage::split::Layer;
/// use pipewright_stage::{Footprint, ModuleError, Param, Parameters, Tensor};
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
/// use pipewright_stage::split::Layer;
/// use pipewright_stage::{ModuleError, Param, Parameters, Tensor};
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
/// `#[derive(Parameters)]` lists the fields that hold parameters; one left out of the list
/// would train frozen without a word, so it does not compile:
///
/// ```compile_fail,E0080
/// use pipewright_stage::kernels::layers::Linear;
/// use pipewright_stage::Parameters;
///
/// #[derive(Parameters)]
/// #[parameters(up)]
/// struct Pair { up: Linear, down: Linear, scale: f32 } // `down` is not listed
/// ```
///
/// unless it is frozen on purpose:
///
/// ```
/// use pipewright_stage::kernels::layers::Linear;
/// use pipewright_stage::{Parameters, Tensor};
///
/// #[derive(Parameters)]
/// #[parameters(up)]
/// struct Pair { up: Linear, #[parameters(skip)] down: Linear, scale: f32 }
///
/// let lin = |n: &str| Linear::new(n, Tensor::zeros(&[2, 2]), None);
/// let pair = Pair { up: lin("up")?, down: lin("down")?, scale: 1.0 };
/// let mut count = 0;
/// pair.visit(&mut |_| count += 1);
/// assert_eq!(count, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
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

    /// Tensor parallelism: how this layer runs on a mesh with `tp > 1`. The default,
    /// [`TpLayout::Whole`], refuses a layer with parameters there (each TP rank would hold
    /// and compute all of it, a silent no-op); a layer that returns
    /// [`TpLayout::Sharded`] holds its rank's shard (built from the rank's
    /// [`TpShard`](pipewright_kernels::layers::TpShard)) and runs through
    /// [`forward_tp`](Self::forward_tp) and [`backward_input_tp`](Self::backward_input_tp),
    /// which take the TP group.
    fn tp_layout(&self) -> TpLayout {
        TpLayout::Whole
    }

    /// The forward on a TP rank, with its group (`tp.all_reduce_sum` sums over it): what a
    /// [`TpLayout::Sharded`] layer implements. The default is [`forward`](Self::forward).
    fn forward_tp(
        &mut self,
        x: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, Self::Stash), ModuleError> {
        let _ = tp;
        self.forward(x)
    }

    /// The input backward on a TP rank, with its group. The default is
    /// [`backward_input`](Self::backward_input).
    fn backward_input_tp(
        &mut self,
        stash: Self::Stash,
        dy: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError> {
        let _ = tp;
        self.backward_input(stash, dy)
    }
}

/// How a [`Layer`] runs on a tensor-parallel mesh ([`Layer::tp_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpLayout {
    /// It holds all of its parameters and cannot shard: refused under `tp > 1` if it has
    /// parameters (a layer without parameters runs the same on every rank).
    Whole,
    /// Its parameters are replicated on every TP rank on purpose (a norm, a small input
    /// projection): every rank computes the same from the same input, and their gradients
    /// agree.
    Replicated,
    /// It holds this rank's shard and sums over the TP group in its `forward_tp` and
    /// `backward_input_tp` (the kernels' [`Mlp`](pipewright_kernels::layers::Mlp) built
    /// from a `TpShard` is one): its output and input gradient are whole on every rank.
    Sharded,
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
    /// [`Layer::forward_tp`], its stash erased (`NoTp` off a tensor-parallel mesh).
    fn forward_dyn(
        &mut self,
        x: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, LayerStash), ModuleError>;
    /// [`Layer::backward_input_tp`] of a stash of this layer's forward.
    fn backward_input_dyn(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, LayerStash), ModuleError>;
    /// [`Layer::tp_layout`].
    fn tp_layout_dyn(&self) -> TpLayout;
    /// [`Layer::backward_weight`] of a stash of this layer's input backward.
    fn backward_weight_dyn(&mut self, stash: LayerStash) -> Result<(), ModuleError>;
    /// The layer's type, for errors that name it (`std::any::type_name`, path trimmed).
    fn type_name(&self) -> &'static str;
}

impl<L: Layer> DynLayer for L {
    fn forward_dyn(
        &mut self,
        x: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, LayerStash), ModuleError> {
        let (y, s) = self.forward_tp(x, tp)?;
        Ok((y, LayerStash::new(s)))
    }

    fn backward_input_dyn(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, LayerStash), ModuleError> {
        let (dx, ws) = self.backward_input_tp(stash.take()?, dy, tp)?;
        Ok((dx, LayerStash::new(ws)))
    }

    fn tp_layout_dyn(&self) -> TpLayout {
        self.tp_layout()
    }

    fn backward_weight_dyn(&mut self, stash: LayerStash) -> Result<(), ModuleError> {
        self.backward_weight(stash.take()?)
    }

    fn type_name(&self) -> &'static str {
        let full = std::any::type_name::<L>();
        // `my_crate::model::Dense<f32>` reads `Dense<f32>`: the path up to the type's own name.
        let end = full.find('<').unwrap_or(full.len());
        full[..end].rfind("::").map_or(full, |i| &full[i + 2..])
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
    /// A stage's layer range that the profile does not hold.
    #[error("stage {stage}'s layers {start}..{end} are not within the profile's {layers} layers")]
    Range {
        /// The stage's index in the partition.
        stage: usize,
        /// First layer of the stage.
        start: usize,
        /// One past its last layer.
        end: usize,
        /// Layers the profile holds.
        layers: usize,
    },
    /// A TP degree a profile cannot record.
    #[error("tp {0} must be from 1 to {max} (the TP degree the layers are measured at)", max = pipewright_model::layer_profile::MAX_TP)]
    Tp(u32),
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
/// cut `pipewright plan --profile` assumes ([`pipewright_model::layer_profile::balanced`]).
pub fn balanced(weights: &[f64], stages: usize) -> Result<Vec<Range<usize>>, SplitError> {
    check_counts(weights.len(), stages)?;
    pipewright_model::layer_profile::balanced(weights, stages).ok_or(SplitError::TooFewLayers {
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

/// Each stage's cost, the sum of its layers' profiled times (in ms). As a cost file for
/// `pipewright search --costs` or `simulate --costs`:
/// `RawCostFile::from_stage_ms(stage_costs(..).iter().map(|c| [c.f, c.i, c.w]), source)`.
pub fn stage_costs(
    profile: &[LayerCost],
    partition: &[Range<usize>],
) -> Result<Vec<LayerCost>, SplitError> {
    let stage = |(k, r): (usize, &Range<usize>)| {
        let Some(layers) = profile.get(r.clone()) else {
            let layers = profile.len();
            let (start, end) = (r.start, r.end);
            return Err(SplitError::Range {
                stage: k,
                start,
                end,
                layers,
            });
        };
        let sum = |pick: fn(&LayerCost) -> f64| layers.iter().map(pick).sum();
        Ok(LayerCost {
            f: sum(|c| c.f),
            i: sum(|c| c.i),
            w: sum(|c| c.w),
        })
    };
    partition.iter().enumerate().map(stage).collect()
}
