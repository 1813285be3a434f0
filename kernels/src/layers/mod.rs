//! Layers with parameters, backward split into input (I) and weight (W)
//! parts, and tensor-parallel (TP) shards.
//!
//! Conventions shared by every layer here:
//! - A linear weight is stored `[in, out]` so `y = x @ W + b` runs on
//!   row-major activations without a transpose.
//! - `forward` returns the output and a *stash* holding what the input
//!   backward needs; `backward_input` consumes the stash and returns the
//!   input gradient plus a *weight stash* holding exactly what
//!   `backward_weight` needs; `backward_weight` accumulates into the
//!   parameters' gradients. Running I then W is the full backward.
//! - Communication stays out: a layer that needs an all-reduce across its TP
//!   group calls [`TpReduce`], which the runtime implements over its
//!   communicator. `*_partial` variants return the un-reduced partial sums.

/// `Clone` for a backend-generic type whenever the backend's tensors are
/// `Clone` (the host's are, a GPU's are not: copying device memory should
/// be an explicit, fallible call). `derive` cannot say this: it would
/// demand `Clone` of the backend and miss the tensors nested in sublayers.
macro_rules! clone_if_tensors_clone {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl<B: $crate::backend::Backend> Clone for $ty<B>
        where
            B::Storage: Clone,
            B::NormStash: Clone,
            B::AttnStash: Clone,
            B::Kept: Clone,
        {
            fn clone(&self) -> Self {
                Self { $($field: self.$field.clone()),* }
            }
        }
    };
}
pub(crate) use clone_if_tensors_clone;

/// [`Footprint`](crate::footprint::Footprint) of a stash: the sum of the listed fields' bytes.
macro_rules! footprint_of {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl<B: $crate::backend::Backend> $crate::footprint::Footprint for $ty<B> {
            fn bytes(&self) -> usize {
                0 $(+ $crate::footprint::Footprint::bytes(&self.$field))*
            }
        }
    };
}
pub(crate) use footprint_of;

pub mod attention;
pub mod block;
pub mod ffn;
pub mod head;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod seq;
pub mod shard;

pub use attention::{Attention, AttentionStash, AttentionWeightStash, Heads};
pub use block::{Block, BlockStash, BlockWeightStash};
pub use ffn::{FeedForward, FfnStash, FfnWeightStash};
pub use head::{HeadStash, HeadWeightStash, LmHead};
pub use linear::{ColumnParallelLinear, Linear, RowParallelLinear};
pub use mlp::{Mlp, MlpKind, MlpKindExt, MlpStash, MlpWeightStash};
pub use moe::{Moe, MoeConfig, MoeStash, MoeWeightStash};
pub use norm::{Embedding, LayerNorm, Norm, NormKind, RmsNorm};
pub use shard::TpShard;

use crate::backend::{Backend, Shaped};

use crate::cpu::Cpu;
use crate::error::Result;
use crate::tensor::Tensor;
use std::borrow::{Borrow, BorrowMut};
use std::sync::{Arc, OnceLock};

/// The host backend shared by every CPU layer (a CPU layer holds its
/// backend like any other, and `Cpu` has no state worth a second copy).
pub(crate) fn cpu_backend() -> Arc<Cpu> {
    static CPU: OnceLock<Arc<Cpu>> = OnceLock::new();
    CPU.get_or_init(|| Arc::new(Cpu)).clone()
}

/// One parameter tensor and its accumulated gradient; `S` is the backend's
/// tensor type (a host [`Tensor`] by default).
#[derive(Clone, Debug)]
pub struct Param<S = Tensor> {
    /// Stable, unique name within a model (e.g. `blocks.3.mlp.fc1.weight`);
    /// shards keep the full tensor's name.
    pub name: String,
    /// The values.
    pub value: S,
    /// The gradient, same shape, accumulated by backward passes.
    pub grad: S,
    /// Whether AdamW's weight decay applies (matrices yes; biases, norms no).
    pub decay: bool,
}

impl Param {
    /// A parameter with zero gradient.
    pub fn new(name: impl Into<String>, value: Tensor, decay: bool) -> Self {
        let grad = Tensor::zeros(value.shape());
        Self {
            name: name.into(),
            value,
            grad,
            decay,
        }
    }
}

impl<S> Param<S> {
    /// `value` uploaded to `be`, with a zero gradient there.
    pub fn on<B: Backend<Storage = S>>(
        be: &B,
        name: impl Into<String>,
        value: &Tensor,
        decay: bool,
    ) -> Result<Self> {
        Ok(Self {
            name: name.into(),
            value: be.upload(value)?,
            grad: be.zeros(value.shape())?,
            decay,
        })
    }
}

/// Something that owns parameters, visited in a fixed order. The order
/// defines the flat view used by optimizers and gradient all-reduces.
///
/// `S` is the tensor type (a host [`Tensor`] by default). The flat views
/// below read and write host memory, so they exist for host tensors only;
/// [`crate::params`] has their counterparts for any backend.
pub trait Parameters<S: Shaped = Tensor> {
    /// Calls `f` on every parameter, in the fixed order.
    fn visit(&self, f: &mut dyn FnMut(&Param<S>));
    /// Calls `f` on every parameter mutably, in the same order.
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<S>));

    /// Total number of scalar parameters.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit(&mut |p| n += p.value.numel());
        n
    }

    /// Sets every gradient to zero.
    fn zero_grad(&mut self)
    where
        S: BorrowMut<Tensor>,
    {
        self.visit_mut(&mut |p| host_mut(&mut p.grad).fill_zero());
    }

    /// All values concatenated in visit order (a copy).
    fn flat_params(&self) -> Vec<f32>
    where
        S: BorrowMut<Tensor>,
    {
        let mut out = Vec::with_capacity(self.num_params());
        self.visit(&mut |p| out.extend_from_slice(host(&p.value).data()));
        out
    }

    /// All gradients concatenated in visit order (a copy), e.g. to all-reduce
    /// them across data-parallel replicas in one message.
    fn flat_grads(&self) -> Vec<f32>
    where
        S: BorrowMut<Tensor>,
    {
        let mut out = Vec::with_capacity(self.num_params());
        self.visit(&mut |p| out.extend_from_slice(host(&p.grad).data()));
        out
    }

    /// Overwrites the values from a flat vector; errors on a length mismatch.
    fn set_flat_params(&mut self, flat: &[f32]) -> Result<()>
    where
        S: BorrowMut<Tensor>,
    {
        set_flat(self, flat, |p| host_mut(&mut p.value))
    }

    /// Overwrites the gradients from a flat vector; errors on a length mismatch.
    fn set_flat_grads(&mut self, flat: &[f32]) -> Result<()>
    where
        S: BorrowMut<Tensor>,
    {
        set_flat(self, flat, |p| host_mut(&mut p.grad))
    }
}

/// `#[derive(Parameters)]` with `#[parameters(a, b)]`: a layer's visit as its parts' visits,
/// in the order listed ([`pipewright_derive`]).
pub use pipewright_derive::Parameters;

/// A parameter visits itself: a layer's own `Param` fields are parts like any other.
impl<S: Shaped> Parameters<S> for Param<S> {
    fn visit(&self, f: &mut dyn FnMut(&Param<S>)) {
        f(self)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<S>)) {
        f(self)
    }
}

/// An optional part (a bias, the embedding of the first stage only) visits when present.
impl<S: Shaped, P: Parameters<S>> Parameters<S> for Option<P> {
    fn visit(&self, f: &mut dyn FnMut(&Param<S>)) {
        if let Some(p) = self {
            p.visit(f);
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<S>)) {
        if let Some(p) = self {
            p.visit_mut(f);
        }
    }
}

/// A boxed part (a layer of a list of layers of different types).
impl<S: Shaped, P: Parameters<S> + ?Sized> Parameters<S> for Box<P> {
    fn visit(&self, f: &mut dyn FnMut(&Param<S>)) {
        (**self).visit(f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<S>)) {
        (**self).visit_mut(f)
    }
}

/// A list of parameter owners (a stack of layers) visits each in order.
impl<S: Shaped, P: Parameters<S>> Parameters<S> for Vec<P> {
    fn visit(&self, f: &mut dyn FnMut(&Param<S>)) {
        self.iter().for_each(|p| p.visit(f));
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<S>)) {
        self.iter_mut().for_each(|p| p.visit_mut(f));
    }
}

/// A host tensor seen as itself (names the `Borrow` meant, which inference
/// could not pick between `Borrow<Tensor>` and `Borrow<S>`).
fn host<S: Borrow<Tensor>>(s: &S) -> &Tensor {
    s.borrow()
}

fn host_mut<S: BorrowMut<Tensor>>(s: &mut S) -> &mut Tensor {
    s.borrow_mut()
}

fn set_flat<S: Shaped, P: Parameters<S> + ?Sized>(
    m: &mut P,
    flat: &[f32],
    pick: fn(&mut Param<S>) -> &mut Tensor,
) -> Result<()> {
    let n = m.num_params();
    if flat.len() != n {
        return Err(crate::error::shape_err(
            "set_flat",
            format!("{} values for {n} parameters", flat.len()),
        ));
    }
    let mut off = 0;
    m.visit_mut(&mut |p| {
        let t = pick(p);
        let len = t.numel();
        t.data_mut().copy_from_slice(&flat[off..off + len]);
        off += len;
    });
    Ok(())
}

/// The all-reduce a tensor-parallel layer needs, supplied by the runtime.
///
/// Called, in the same order on every rank of a TP group, with each rank's
/// partial sum; on return every rank must hold the elementwise sum. For
/// bit-identical replicas the implementation should sum in a fixed rank
/// order. [`NoTp`] is the implementation for `tp = 1`.
///
/// `T` is the tensor type of the backend the layers run on: a host
/// [`Tensor`] by default, a device tensor on a GPU.
///
/// Sequence parallelism ([`seq`]) also needs the two collectives below; a
/// group that offers only the all-reduce refuses it, in one line.
pub trait TpReduce<T = Tensor> {
    /// Replaces `t` with the sum of `t` over the TP group.
    fn all_reduce_sum(&mut self, t: &mut T) -> Result<()>;

    /// Every rank's `t` (all of one shape), in group order.
    fn all_gather(&mut self, t: &T) -> Result<Vec<T>> {
        let _ = t;
        Err(crate::error::KernelError::Config(NO_SEQ.into()))
    }

    /// The group's elementwise sum of `t` seen flat (row-major) and cut into
    /// `size` equal contiguous blocks, of which this rank keeps block `rank`
    /// (any shape with that many values). Summed in the order the all-reduce
    /// uses, so the block holds the all-reduce's bits.
    fn reduce_scatter_sum(&mut self, t: &T) -> Result<T> {
        let _ = t;
        Err(crate::error::KernelError::Config(NO_SEQ.into()))
    }

    /// The all-to-all of the expert-parallel group the mixtures of experts run over
    /// ([`moe::ep`]), where the runtime gives them one; `None`: every expert is here.
    fn expert_exchange(&mut self) -> Option<&mut dyn moe::ep::ExpertExchange> {
        None
    }
}

const NO_SEQ: &str = "sequence parallelism needs a tensor-parallel group with all-gather and \
     reduce-scatter; this one only all-reduces";

/// The TP all-reduce of a group of one: does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTp;

impl<T> TpReduce<T> for NoTp {
    fn all_reduce_sum(&mut self, _t: &mut T) -> Result<()> {
        Ok(())
    }
}
