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

pub mod attention;
pub mod block;
pub mod head;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod shard;

pub use attention::{Attention, AttentionStash, AttentionWeightStash};
pub use block::{Block, BlockStash, BlockWeightStash};
pub use head::{HeadStash, HeadWeightStash, LmHead};
pub use linear::{ColumnParallelLinear, Linear, RowParallelLinear};
pub use mlp::{Mlp, MlpStash, MlpWeightStash};
pub use norm::{Embedding, LayerNorm};
pub use shard::TpShard;

use crate::error::Result;
use crate::tensor::Tensor;

/// One parameter tensor and its accumulated gradient.
#[derive(Clone, Debug)]
pub struct Param {
    /// Stable, unique name within a model (e.g. `blocks.3.mlp.fc1.weight`);
    /// shards keep the full tensor's name.
    pub name: String,
    /// The values.
    pub value: Tensor,
    /// The gradient, same shape, accumulated by backward passes.
    pub grad: Tensor,
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

/// Something that owns parameters, visited in a fixed order. The order
/// defines the flat view used by optimizers and gradient all-reduces.
pub trait Parameters {
    /// Calls `f` on every parameter, in the fixed order.
    fn visit(&self, f: &mut dyn FnMut(&Param));
    /// Calls `f` on every parameter mutably, in the same order.
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param));

    /// Total number of scalar parameters.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit(&mut |p| n += p.value.numel());
        n
    }

    /// Sets every gradient to zero.
    fn zero_grad(&mut self) {
        self.visit_mut(&mut |p| p.grad.fill_zero());
    }

    /// All values concatenated in visit order (a copy).
    fn flat_params(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.num_params());
        self.visit(&mut |p| out.extend_from_slice(p.value.data()));
        out
    }

    /// All gradients concatenated in visit order (a copy), e.g. to all-reduce
    /// them across data-parallel replicas in one message.
    fn flat_grads(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.num_params());
        self.visit(&mut |p| out.extend_from_slice(p.grad.data()));
        out
    }

    /// Overwrites the values from a flat vector; errors on a length mismatch.
    fn set_flat_params(&mut self, flat: &[f32]) -> Result<()> {
        set_flat(self, flat, |p| &mut p.value)
    }

    /// Overwrites the gradients from a flat vector; errors on a length mismatch.
    fn set_flat_grads(&mut self, flat: &[f32]) -> Result<()> {
        set_flat(self, flat, |p| &mut p.grad)
    }
}

fn set_flat<P: Parameters + ?Sized>(
    m: &mut P,
    flat: &[f32],
    pick: fn(&mut Param) -> &mut Tensor,
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
pub trait TpReduce<T = Tensor> {
    /// Replaces `t` with the sum of `t` over the TP group.
    fn all_reduce_sum(&mut self, t: &mut T) -> Result<()>;
}

/// The TP all-reduce of a group of one: does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTp;

impl<T> TpReduce<T> for NoTp {
    fn all_reduce_sum(&mut self, _t: &mut T) -> Result<()> {
        Ok(())
    }
}
