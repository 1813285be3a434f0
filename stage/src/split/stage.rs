//! [`LayerStage`]: a stage's layers as a [`StageModule`], whose errors name the layer (its
//! index in the model and its type) and what it was doing.

use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::rc::Rc;

use pipewright_kernels::layers::{Parameters, TpReduce};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{params, Tensor};
use pipewright_schedule::Recompute;

use super::{BoxedLayer, LayerStash, TpLayout};
use crate::host::{self, HostAdamW};
use crate::module::{MicrobatchData, ModuleError, Output, ParamName, StageModule};

/// The loss of a model's last layer's output against a microbatch's data, and its gradient:
/// the *mean* loss of the microbatch, unscaled. The stage multiplies both by the runtime's
/// loss scale (`1 / (dp * m)`) itself, so the runtime's sum over the global batch's `dp * m`
/// microbatches is the global batch's mean and a loss cannot forget the scale: a loss that
/// takes the scale as an argument, as a hand-written [`StageModule`] does, does not compile.
///
/// ```compile_fail,E0593
/// use pipewright_stage::split::{BoxedLayer, LayerStage};
/// use pipewright_stage::{ModuleError, Tensor};
///
/// let layer = |_: usize| -> Result<BoxedLayer, ModuleError> { Err("unused".into()) };
/// let loss = |p: &Tensor, _: &Tensor, scale: f32| Ok((scale, p.clone()));
/// let _ = LayerStage::part(&[0..1], 0, layer, |d: &Tensor| Ok(d.clone()), loss);
/// ```
pub type LossFn<D> = dyn Fn(&Tensor, &D) -> Result<(f32, Tensor), ModuleError>;

/// The first stage's input from a microbatch's data.
pub type InputFn<D> = dyn Fn(&D) -> Result<Tensor, ModuleError>;

/// One stage of a layer-list model: its layers, the model's input function on the first
/// stage and its loss on the last, AdamW over its parameters. It offers full recomputation
/// (its layers' forwards run again from the kept stage input, so they must give the same
/// result twice, as a forward without dropout or other hidden state does); a layer's stash
/// is its own opaque type, so selective recomputation is not offered.
///
/// Its errors name the layer (`layer 4 (Dense)`, its index in the whole model under
/// [`part`](Self::part)) and the method that failed; a layer whose `backward_input` returns
/// a gradient of another shape than its forward's input is refused there, and a first layer
/// that fails on the previous stage's hand-off is named with the hand-off's shape.
pub struct LayerStage<D> {
    /// In order; their parameters are visited in that order.
    layers: Vec<BoxedLayer>,
    /// The model's index of `layers[0]` (for errors).
    first_layer: usize,
    /// The stage's index, when [`part`](Self::part) built it (for errors).
    stage: Option<u32>,
    input: Option<Rc<InputFn<D>>>,
    /// The model's input function on every stage `part` built: the fingerprint of a
    /// microbatch's data that the run compares between ranks.
    probe: Option<Rc<InputFn<D>>>,
    loss: Option<Rc<LossFn<D>>>,
    /// The model's loss on every stage `part` built, with the shape of the prediction the
    /// last stage's loss took: the fingerprint of a microbatch's targets that the run
    /// compares between ranks.
    probe_loss: Option<Rc<LossFn<D>>>,
    prediction_shape: Option<Vec<usize>>,
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
    /// Each layer's input shape: what its input gradient must have.
    #[footprint(skip)]
    shapes: Vec<Box<[usize]>>,
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
        let input: Option<Rc<InputFn<D>>> = input.map(Rc::from);
        let loss: Option<Rc<LossFn<D>>> = loss.map(Rc::from);
        LayerStage {
            layers,
            first_layer: 0,
            stage: None,
            probe: input.clone(),
            input,
            probe_loss: loss.clone(),
            prediction_shape: None,
            loss,
            opt: HostAdamW::default(),
            full_recompute: false,
        }
    }

    /// Stage `stage` of a model cut at `cuts` (from [`cut`](super::cut) or
    /// [`split`](super::split)): its layers built by `layer(k)`, the model's `input` function
    /// if it is the first stage and its `loss` (unscaled: see [`LossFn`]) if it is the last.
    /// A run's `make` closure is then `|_, s| LayerStage::part(&cuts, s, layer, input, loss)`,
    /// and `part(&[0..n], 0, ..)` is the whole model on one device.
    pub fn part<I, L>(
        cuts: &[Range<usize>],
        stage: u32,
        layer: impl Fn(usize) -> Result<BoxedLayer, ModuleError>,
        input: I,
        loss: L,
    ) -> Result<Self, ModuleError>
    where
        I: Fn(&D) -> Result<Tensor, ModuleError> + 'static,
        L: Fn(&Tensor, &D) -> Result<(f32, Tensor), ModuleError> + 'static,
    {
        let range = cuts
            .get(stage as usize)
            .ok_or_else(|| format!("stage {stage} is not one of the {} cuts", cuts.len()))?;
        let last = cuts.last().map_or(0, |r| r.end);
        let layers = range.clone().map(layer).collect::<Result<_, _>>()?;
        let probe: Rc<InputFn<D>> = Rc::new(input);
        let probe_loss: Rc<LossFn<D>> = Rc::new(loss);
        let mut s = LayerStage::new(layers, None, None);
        s.loss = (range.end == last).then(|| probe_loss.clone());
        s.input = (range.start == 0).then(|| probe.clone());
        s.probe = Some(probe);
        s.probe_loss = Some(probe_loss);
        s.first_layer = range.start;
        s.stage = Some(stage);
        Ok(s)
    }

    /// `layer 4 (Dense)`: the model's index of this stage's layer `i` and its type.
    fn layer_name(&self, i: usize) -> String {
        let ty = self.layers.get(i).map_or("?", |l| l.type_name());
        format!("layer {} ({ty})", self.first_layer + i)
    }

    /// The forward, keeping every layer's stash (`keep`) or none of them.
    fn run_forward(
        &mut self,
        mb: &MicrobatchData<'_, D>,
        input: Option<Tensor>,
        keep: bool,
        tp: &mut dyn TpReduce,
    ) -> Result<(Output, LayerStageStash), ModuleError> {
        let handed = input.is_some();
        let mut x = match (input, &self.input) {
            (Some(x), _) => x,
            (None, Some(f)) => f(mb.data).map_err(|e| format!("the input function: {e}"))?,
            (None, None) => return Err("a first stage needs an input function".into()),
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut shapes = Vec::with_capacity(self.layers.len());
        for i in 0..self.layers.len() {
            let (y, s) = match self.layers[i].forward_dyn(&x, tp) {
                Ok(r) => r,
                Err(e) => return Err(self.forward_error(i, handed, &x, e)),
            };
            if keep {
                layers.push(s);
                shapes.push(x.shape().into());
            }
            x = y;
        }
        let mut stash = LayerStageStash {
            layers,
            loss_grad: None,
            input: None,
            shapes,
            slim: !keep,
        };
        match self.loss.clone() {
            Some(loss) => {
                let (l, mut grad) = loss(&x, mb.data).map_err(|e| format!("the loss: {e}"))?;
                self.prediction_shape = Some(x.shape().to_vec());
                if grad.shape() != x.shape() {
                    let msg = format!(
                        "the loss returned a gradient of shape {:?} for a prediction of shape \
                         {:?}",
                        grad.shape(),
                        x.shape()
                    );
                    return Err(msg.into());
                }
                grad.data_mut().iter_mut().for_each(|g| *g *= mb.loss_scale);
                stash.loss_grad = keep.then_some(grad);
                Ok((Output::Loss(l * mb.loss_scale), stash))
            }
            None => Ok((Output::Hidden(x), stash)),
        }
    }

    /// Layer `i`'s forward error, naming it, and the hand-off it was given when it is the
    /// stage's first layer after another stage (a width mismatch between stages shows here).
    fn forward_error(&self, i: usize, handed: bool, x: &Tensor, e: ModuleError) -> ModuleError {
        let name = self.layer_name(i);
        let from = match self.stage {
            Some(s) if s > 0 => format!("stage {}'s", s - 1),
            _ => "the previous stage's".into(),
        };
        if i == 0 && handed {
            let here = self
                .stage
                .map_or("this stage".into(), |s| format!("stage {s}"));
            format!(
                "{name}, the first of {here}, cannot take {from} hand-off of shape {:?} \
                 (what the previous stage's last layer returns): forward: {e}",
                x.shape()
            )
            .into()
        } else {
            format!("{name}: forward of an input of shape {:?}: {e}", x.shape()).into()
        }
    }
}

/// A fingerprint of a tensor's shape and bits (not a checksum against tampering: equal
/// data gives equal fingerprints on every rank of a run, unequal data almost surely not).
fn fingerprint(t: &Tensor) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.shape().hash(&mut h);
    t.data().iter().for_each(|v| v.to_bits().hash(&mut h));
    h.finish()
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
        tp: &mut dyn TpReduce,
    ) -> Result<(Output, Self::Stash), ModuleError> {
        if !self.full_recompute {
            return self.run_forward(mb, input, true, tp);
        }
        let kept = input.clone();
        let (out, mut stash) = self.run_forward(mb, input, false, tp)?;
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
        tp: &mut dyn TpReduce,
    ) -> Result<LayerStageStash, ModuleError> {
        if !stash.slim {
            return Ok(stash);
        }
        Ok(self.run_forward(mb, stash.input, true, tp)?.1)
    }

    fn backward_input(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
        if stash.slim {
            return Err("the stash was not recomputed before the backward".into());
        }
        let (stashes, shapes) = (stash.layers, stash.shapes);
        let mut dy = grad_out.or(stash.loss_grad).ok_or("no output gradient")?;
        let mut ws = Vec::with_capacity(stashes.len());
        for (i, s) in stashes.into_iter().enumerate().rev() {
            let (dx, w) = self.layers[i]
                .backward_input_dyn(s, &dy, tp)
                .map_err(|e| format!("{}: backward_input: {e}", self.layer_name(i)))?;
            // Blamed here, on the layer that returned it, not in the next layer's matmul.
            if dx.shape() != &*shapes[i] {
                let msg = format!(
                    "{}: backward_input returned an input gradient of shape {:?}, but its \
                     forward's input had shape {:?}",
                    self.layer_name(i),
                    dx.shape(),
                    shapes[i]
                );
                return Err(msg.into());
            }
            ws.push(w);
            dy = dx;
        }
        Ok((Some(dy), ws))
    }

    fn backward_weight(&mut self, ws: Self::WeightStash) -> Result<(), ModuleError> {
        // `ws` runs from the last layer to the first.
        let n = self.layers.len();
        for (k, w) in ws.into_iter().enumerate() {
            let i = n - 1 - k;
            self.layers[i]
                .backward_weight_dyn(w)
                .map_err(|e| format!("{}: backward_weight: {e}", self.layer_name(i)))?;
        }
        Ok(())
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

    fn parameter_names(&self) -> Option<Vec<ParamName>> {
        let mut names = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let (k, ty) = (self.first_layer + i, layer.type_name());
            layer.visit(&mut |p| {
                names.push(ParamName::new(format!("{} (layer {k}, {ty})", p.name), p))
            });
        }
        Some(names)
    }

    fn data_fingerprint(&self, data: &D) -> Result<Option<u64>, ModuleError> {
        match &self.probe {
            Some(f) => Ok(Some(fingerprint(&f(data)?))),
            None => Ok(None),
        }
    }

    fn prediction_shape(&self) -> Option<Vec<usize>> {
        self.prediction_shape.clone()
    }

    /// The loss and its gradient at a prediction of zeros of `shape`: they depend on the
    /// targets alone. A loss that fails there is not fingerprinted.
    fn target_fingerprint(&self, data: &D, shape: &[usize]) -> Result<Option<u64>, ModuleError> {
        let Some(loss) = &self.probe_loss else {
            return Ok(None);
        };
        let Ok((l, grad)) = loss(&Tensor::zeros(shape), data) else {
            return Ok(None);
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        l.to_bits().hash(&mut h);
        fingerprint(&grad).hash(&mut h);
        Ok(Some(h.finish()))
    }

    /// Refuses layers with parameters that cannot shard ([`TpLayout::Whole`]).
    fn check_tp(&self, tp: usize) -> Result<(), ModuleError> {
        let whole: Vec<String> = (0..self.layers.len())
            .filter(|&i| {
                let l = &self.layers[i];
                l.tp_layout_dyn() == TpLayout::Whole && l.num_params() > 0
            })
            .map(|i| self.layer_name(i))
            .collect();
        if whole.is_empty() {
            return Ok(());
        }
        Err(format!(
            "tp = {tp}, but {} {} parameters and cannot shard (Layer::tp_layout is \
             TpLayout::Whole): every TP rank would hold and compute all of it, so tp would \
             change nothing. Build the layer from the rank's TpShard and declare \
             TpLayout::Sharded (the kernels' Mlp is one), declare TpLayout::Replicated for a \
             small one kept whole on purpose, or run with tp = 1",
            whole.join(", "),
            if whole.len() == 1 { "holds" } else { "hold" }
        )
        .into())
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
