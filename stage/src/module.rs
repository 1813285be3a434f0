//! `StageModule`: what a user implements for one chunk of a model. The runtime has two
//! implementations of its own: the reference GPT (`GptModule`) and synthetic stages of exact
//! durations (`SyntheticModule`).

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pipewright_kernels::gpt::StageOutput;
use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{Footprint, Shaped, Tensor};
use pipewright_schedule::Recompute;

pub use crate::param_name::ParamName;

/// An error from user code: a module's methods and the run's closures return it, and `?`
/// converts into it a user's own `Box<dyn Error>`, any error type (the kernels',
/// `std::io::Error`, a candle or anyhow error), a `String` or a `&str`. The runtime reads it
/// on the rank's own thread, so it need not be `Send`; a `Box<dyn Error + Send + Sync>`
/// converts with `.map_err(|e| e as ModuleError)`.
pub type ModuleError = Box<dyn std::error::Error>;

/// What a default method of [`StageModule`] returns when the module did not implement it:
/// the runtime tells it apart from the module's own errors, so that a run whose answer
/// depends on the method is refused before its first step, naming the stage and the method
/// (the runtime's `RuntimeError::Missing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("its module does not implement {method}")]
pub struct Unimplemented {
    /// The method.
    pub method: &'static str,
}

/// The [`Unimplemented`] error of `method`, boxed.
fn unimplemented(method: &'static str) -> ModuleError {
    Box::new(Unimplemented { method })
}

/// The method `e` says is not implemented, when it is an [`Unimplemented`].
pub fn unimplemented_method(e: &ModuleError) -> Option<&'static str> {
    e.downcast_ref::<Unimplemented>().map(|u| u.method)
}

/// Run user code, turning a panic into an error that names it.
pub fn guard<T>(f: impl FnOnce() -> Result<T, ModuleError>) -> Result<T, ModuleError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("stage panicked: {msg}").into())
        }
    }
}

/// One microbatch as every stage sees it: the user's own data `D` (the module's
/// [`StageModule::Data`], built on this rank by the run's data function) and the runtime's
/// loss scale.
#[derive(Debug)]
pub struct MicrobatchData<'a, D = ()> {
    /// Microbatch index within the step.
    pub index: u32,
    /// The user's data of this microbatch (inputs for the first stage, targets for the last).
    pub data: &'a D,
    /// `1 / (dp * m)`, one over the microbatches of the global batch. The last stage's
    /// module multiplies its loss *and* the loss's gradient by it; the runtime sums the
    /// scaled losses and gradients over the global batch, which makes them the global
    /// batch's mean (whatever `dp` and `m`, so every mesh trains like one device).
    pub loss_scale: f32,
}

// Not derived: a reference is `Copy` whatever `D` is.
impl<D> Clone for MicrobatchData<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D> Copy for MicrobatchData<'_, D> {}

const NO_SHARD: &str = "this stage cannot shard its optimizer (ZeRO-1): it implements neither \
     optimizer_step_shard nor set_flat_params";

/// What a stage's forward produces.
pub type Output<T = Tensor> = StageOutput<T>;

/// One chunk of a model on one device (and one TP rank). The runtime owns everything around
/// it: stashing per microbatch, hand-offs, when gradients are reduced and when the optimizer
/// steps. The module owns where its tensors live: `Tensor` is a host [`Tensor`] for a CPU
/// stage and a device tensor for a GPU one, and the gradient and optimizer methods let a GPU
/// stage keep its flat gradients and its optimizer state on the device.
///
/// A module whose framework computes the backward in one piece (most autograd frameworks)
/// implements [`backward`](Self::backward), says so with
/// [`splits_backward`](Self::splits_backward), and leaves the I and W methods alone: runs
/// of timetables with I or W actions are then refused before the first step.
///
/// A new method must also be forwarded by `Box<S>` (`boxed.rs`) and by the runtime's
/// `erase.rs`; clippy's `missing_trait_methods`, denied on both, says so.
pub trait StageModule {
    /// The tensors it takes and returns (the communicator's).
    type Tensor: Shaped;
    /// One microbatch of the user's data (`()` for modules that read none): built on every
    /// rank by the run's data function, never sent between ranks.
    type Data;
    /// What forward keeps for the input backward. Its [`Footprint`] is the bytes the
    /// runtime's stash peaks and measured memory count for it: a stash of tensors, norm
    /// stashes, tuples, `Vec`s and `Option`s of them is counted as it is, and a stash type of
    /// the module's own says its bytes (`#[derive(Footprint)]` sums its fields).
    type Stash: Footprint;
    /// What the input backward keeps for the weight backward (counted the same way).
    type WeightStash: Footprint;

    /// Forward of one microbatch; `input` is `None` on the first stage.
    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, Self::Data>,
        input: Option<Self::Tensor>,
        tp: &mut dyn TpReduce<Self::Tensor>,
    ) -> Result<(Output<Self::Tensor>, Self::Stash), ModuleError>;

    /// Whether the module has separate input (I) and weight (W) backwards; `false` for a
    /// module with only a full backward (B), which the runtime then never asks for I or W.
    fn splits_backward(&self) -> bool {
        true
    }

    /// Input-gradient backward (I); `grad_out` is `None` on the last stage. Returns the
    /// gradient for the previous stage (`None` on the first).
    fn backward_input(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Self::Tensor>,
        tp: &mut dyn TpReduce<Self::Tensor>,
    ) -> Result<(Option<Self::Tensor>, Self::WeightStash), ModuleError> {
        let _ = (stash, grad_out, tp);
        Err(unimplemented("backward_input"))
    }

    /// Weight-gradient backward (W): accumulate into the gradients.
    fn backward_weight(&mut self, stash: Self::WeightStash) -> Result<(), ModuleError> {
        let _ = stash;
        Err(unimplemented("backward_weight"))
    }

    /// Full backward (B): I then W. A module with only a full backward implements this.
    fn backward(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Self::Tensor>,
        tp: &mut dyn TpReduce<Self::Tensor>,
    ) -> Result<Option<Self::Tensor>, ModuleError> {
        let (g, ws) = self.backward_input(stash, grad_out, tp)?;
        self.backward_weight(ws)?;
        Ok(g)
    }

    /// Keep only what `policy` says in the stashes of later forwards. The runtime calls this
    /// once per stage, before the first step, for every stage asked to recompute
    /// ([`Recompute::None`] is never asked); an error refuses the run, in one line naming the
    /// stage. The default offers no recomputation.
    fn set_recompute(&mut self, policy: Recompute) -> Result<(), ModuleError> {
        Err(format!("its module offers no {policy} recomputation").into())
    }

    /// Rebuild what a stash left out under the policy of
    /// [`set_recompute`](Self::set_recompute), so the backward can run: the runtime calls it
    /// once per microbatch, just before its first backward (B or I) or at the timetable's
    /// `R` action. With `tp > 1` every TP rank of the stage recomputes together (a full
    /// recompute reruns the forward's all-reduces). Only called after `set_recompute`
    /// accepted a policy, so a module that accepts one implements this (the default is an
    /// error, never a stash passed on as it was).
    fn recompute(
        &mut self,
        mb: &MicrobatchData<'_, Self::Data>,
        stash: Self::Stash,
        tp: &mut dyn TpReduce<Self::Tensor>,
    ) -> Result<Self::Stash, ModuleError> {
        let _ = (mb, stash, tp);
        Err(unimplemented("recompute"))
    }

    /// The accumulated gradients as one flat tensor in a fixed order, for the data-parallel
    /// all-reduce; `Ok(None)` says the stage has no parameters (nothing to reduce).
    ///
    /// A run with more than one data-parallel replica needs it, and
    /// [`set_flat_grads`](Self::set_flat_grads), from every stage: without them each
    /// replica would step on its own gradients. Such a run refuses a module that does not
    /// implement them before its first step (a stage without parameters returns `Ok(None)`),
    /// and one whose `flat_grads` says `Ok(None)`, or holds another number of values than
    /// [`flat_params`](Self::flat_params) while `flat_params` or
    /// [`parameter_bytes`](Self::parameter_bytes) shows parameters;
    /// with one replica it is optional ([`runtime::host`](crate::host) has both for
    /// parameters the kernels' `Parameters` visits).
    fn flat_grads(&mut self) -> Result<Option<Self::Tensor>, ModuleError> {
        Err(unimplemented("flat_grads"))
    }

    /// The first NaN or infinite value of the accumulated gradients, `None` when all are
    /// finite: the run's once-per-step check before the optimizer
    /// (the runtime's `RunOptions::check_finite`). The default scans
    /// [`flat_grads`](Self::flat_grads) when they are host [`Tensor`]s (a module that does not
    /// implement `flat_grads` is checked through its losses and, at the end of the run, its
    /// parameters); a module whose gradients live elsewhere implements it (the GPT on a GPU
    /// downloads them), or a run with the check is refused before its first step.
    fn non_finite_grad(&mut self) -> Result<Option<f32>, ModuleError>
    where
        Self::Tensor: 'static,
    {
        let g = match self.flat_grads() {
            Ok(Some(g)) => g,
            Ok(None) => return Ok(None),
            Err(e) if unimplemented_method(&e).is_some() => return Ok(None),
            Err(e) => return Err(e),
        };
        match (&g as &dyn std::any::Any).downcast_ref::<Tensor>() {
            Some(host) => Ok(first_non_finite(host.data())),
            None => Err(unimplemented("non_finite_grad")),
        }
    }

    /// Replace the gradients with `grads` (the reduced [`flat_grads`](Self::flat_grads)), so
    /// that `flat_grads` then reads `grads`: with host tensors, a run with more than one
    /// data-parallel replica checks that before its first step.
    fn set_flat_grads(&mut self, grads: Self::Tensor) -> Result<(), ModuleError> {
        let _ = grads;
        Err(unimplemented("set_flat_grads"))
    }

    /// One AdamW step from the accumulated gradients (the module keeps its own state, made
    /// from `cfg` on the first step), then zero the gradients. The default does nothing for
    /// a module without parameters, and refuses one whose [`flat_grads`](Self::flat_grads),
    /// [`flat_params`](Self::flat_params) or [`parameter_bytes`](Self::parameter_bytes)
    /// shows some (they would never change).
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        let _ = cfg;
        let grads = matches!(self.flat_grads(), Ok(Some(_)));
        let params = matches!(self.flat_params(), Ok(Some(p)) if !p.is_empty());
        if grads || params || self.parameter_bytes() > 0 {
            return Err(unimplemented("optimizer_step"));
        }
        Ok(())
    }

    /// The parameters, flat on the host in a fixed order (to compare runs and to report
    /// them); `None` without parameters.
    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        Ok(None)
    }

    /// Under expert parallelism (a mesh with `ep > 1`): the runs of
    /// [`flat_grads`](Self::flat_grads) and [`flat_params`](Self::flat_params) values that
    /// hold this rank's experts, one run per mixture, each its rank's contiguous share of the
    /// mixture's experts in expert order. Their gradients are summed over the ranks holding the
    /// same experts, the rest over every replica, and the final parameters splice every EP
    /// rank's runs together. `None` (the default): the module shards no experts, and a run
    /// with `ep > 1` is refused before its first step naming the stage.
    fn expert_ranges(&self) -> Option<Vec<Range<usize>>> {
        None
    }

    /// Refuse, before step 0, a run with `tp > 1` TP ranks that this module would not
    /// shard (it would hold and compute all of its stage on every TP rank, changing
    /// nothing). Called once per stage on every rank when `tp > 1`; an error refuses the run
    /// naming the stage. The default accepts: a hand-written module takes its shard from
    /// the coordinates `make` gets. A layer list refuses layers that cannot shard.
    fn check_tp(&self, tp: usize) -> Result<(), ModuleError> {
        let _ = tp;
        Ok(())
    }

    /// Each parameter's name and number of values, in the order of
    /// [`flat_grads`](Self::flat_grads) and [`flat_params`](Self::flat_params), so that the
    /// run's errors name a parameter (`l3.weight (layer 3, Dense)`) rather than a flat index:
    /// the replica check, and step 0's check for a parameter whose gradient stays exactly
    /// zero (the runtime's `RunOptions::allow_unused`), which runs only
    /// for a module that names its parameters. `None` (the default) names none;
    /// [`runtime::host::parameter_names`](crate::host::parameter_names) names what the
    /// kernels' `Parameters` visits.
    fn parameter_names(&self) -> Option<Vec<ParamName>> {
        None
    }

    /// A fingerprint of one microbatch's data (a hash of the tensors the module makes from
    /// it), or `None` (the default) for none. Before step 0 every rank that built microbatch
    /// `id` compares the fingerprints it got with the other ranks' of its replica, and a run
    /// whose data function gave ranks different data for one id (a reader that depends on
    /// the thread, or that advanced between calls) is refused naming the id and the ranks.
    fn data_fingerprint(&self, data: &Self::Data) -> Result<Option<u64>, ModuleError> {
        let _ = data;
        Ok(None)
    }

    /// The shape of the prediction its loss took in this run (a last stage, after a
    /// forward), or `None` (the default): the shape every rank of the replica then gives
    /// [`target_fingerprint`](Self::target_fingerprint).
    fn prediction_shape(&self) -> Option<Vec<usize>> {
        None
    }

    /// A fingerprint of what the loss reads of one microbatch's data (its targets), from
    /// the loss of a fixed prediction of `shape`, or `None` (the default) for none. At the
    /// end of step 0 every rank compares it with the other ranks' of its replica, as for
    /// [`data_fingerprint`](Self::data_fingerprint): targets that depend on the thread are
    /// refused though only the last stage reads them. `LayerStage` computes it by calling the
    /// loss once more per microbatch on every rank at step 0, so a loss that logs or counts
    /// its calls sees those calls too.
    fn target_fingerprint(
        &self,
        data: &Self::Data,
        shape: &[usize],
    ) -> Result<Option<u64>, ModuleError> {
        let _ = (data, shape);
        Ok(None)
    }

    /// Whether the module implements ZeRO-1's two methods,
    /// [`optimizer_step_shard`](Self::optimizer_step_shard) and
    /// [`set_flat_params`](Self::set_flat_params). Runs with ZeRO-1 over more than one
    /// data-parallel replica refuse a module that does not, before the first step.
    fn shards_optimizer(&self) -> bool {
        false
    }

    /// ZeRO-1's optimizer step: AdamW on `range` of the flat parameters (the layout of
    /// [`flat_grads`](Self::flat_grads)) from `grads`, the reduced gradients of that range
    /// alone (`range.len()` values). The module keeps optimizer state for its range only,
    /// made from `cfg` on the first step (the range is the same every step of a run), returns
    /// the range's updated values (flat) and zeroes its gradients. Its parameters change only
    /// through [`set_flat_params`](Self::set_flat_params), with every replica's ranges.
    fn optimizer_step_shard(
        &mut self,
        cfg: &AdamWConfig,
        range: Range<usize>,
        grads: Self::Tensor,
    ) -> Result<Self::Tensor, ModuleError> {
        let _ = (cfg, range, grads);
        Err(NO_SHARD.into())
    }

    /// Replace every parameter value with `params`, flat in the order of
    /// [`flat_params`](Self::flat_params) (ZeRO-1's all-gathered shards).
    fn set_flat_params(&mut self, params: Self::Tensor) -> Result<(), ModuleError> {
        let _ = params;
        Err(NO_SHARD.into())
    }

    /// Bytes of optimizer state (moments, master weights) the module holds now, for reports:
    /// 0 for a module that does not say.
    fn optimizer_state_bytes(&self) -> usize {
        0
    }

    /// Bytes of parameter values the module holds, for the measured memory
    /// (the runtime's `memory`): 0 for a module that does not say.
    fn parameter_bytes(&self) -> usize {
        0
    }

    /// Bytes of gradient storage the module holds (what backwards accumulate into), for the
    /// measured memory: 0 for a module that does not say.
    fn gradient_bytes(&self) -> usize {
        0
    }

    /// The driver's free and total bytes of the GPU the module runs on, read once per step
    /// for reports; `None` for a module on the host.
    fn device_memory(&self) -> Result<Option<(usize, usize)>, ModuleError> {
        Ok(None)
    }

    /// Sum over the TP group the gradients each TP rank holds only a part of. The runtime
    /// calls it once per step and stage when `tp > 1`, after the stage's last backward and
    /// before the data-parallel reduction and the optimizer, on every TP rank together. The
    /// GPT under sequence parallelism sums its norms' gradients here (each rank saw its
    /// slice of the tokens). The default has nothing to sum.
    fn reduce_tp_grads(&mut self, tp: &mut dyn TpReduce<Self::Tensor>) -> Result<(), ModuleError> {
        let _ = tp;
        Ok(())
    }
}

/// The first NaN or infinity in `xs`.
pub fn first_non_finite(xs: &[f32]) -> Option<f32> {
    xs.iter().copied().find(|x| !x.is_finite())
}
