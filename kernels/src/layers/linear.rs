//! `y = x @ W + b`, whole and as column- or row-parallel shards.
//!
//! The stash of a linear layer is simply its input `x` (the caller keeps
//! it), and its weight stash is `(x, dy)`: the input gradient `dy @ W^T`
//! needs only the weight, the weight gradient `x^T @ dy` needs only `x` and
//! `dy`. So layers that contain linears store those tensors in their own
//! stashes instead of a stash type per linear.
//!
//! Every layer holds its backend (an `Arc`, shared by all layers of a
//! stage), so its methods look the same on the CPU and on a GPU.

use super::shard::{shard_col_segments, shard_rows, TpShard};
use super::{cpu_backend, Param, Parameters};
use crate::backend::{Backend, Shaped};
use crate::cpu::Cpu;
use crate::error::{shape_err, Result};
use crate::tensor::Tensor;
use std::sync::Arc;

/// A dense layer with weight `[in, out]` and optional bias `[out]`.
#[derive(Debug)]
pub struct Linear<B: Backend = Cpu> {
    /// `[in, out]`.
    pub weight: Param<B::Storage>,
    /// `[out]`, if any.
    pub bias: Option<Param<B::Storage>>,
    be: Arc<B>,
}

super::clone_if_tensors_clone!(Linear { weight, bias, be });

impl Linear {
    /// A layer from its weights; `name` prefixes the parameter names
    /// (`{name}.weight`, `{name}.bias`).
    pub fn new(name: &str, weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        Self::on(&cpu_backend(), name, &weight, bias.as_ref())
    }
}

impl<B: Backend> Linear<B> {
    /// A layer on `be` from host weights (uploaded); names as [`Linear::new`].
    pub fn on(be: &Arc<B>, name: &str, weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        if weight.shape().len() != 2 {
            return Err(shape_err(
                "Linear::new",
                format!("weight {:?}", weight.shape()),
            ));
        }
        if let Some(b) = bias {
            if b.shape() != [weight.cols()] {
                return Err(shape_err(
                    "Linear::new",
                    format!("bias {:?} for weight {:?}", b.shape(), weight.shape()),
                ));
            }
        }
        Ok(Self {
            weight: Param::on(&**be, format!("{name}.weight"), weight, true)?,
            bias: bias
                .map(|b| Param::on(&**be, format!("{name}.bias"), b, false))
                .transpose()?,
            be: be.clone(),
        })
    }

    /// The backend this layer runs on.
    pub fn backend(&self) -> &Arc<B> {
        &self.be
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.value.shape()[0]
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.value.shape()[1]
    }

    /// `x @ W + b` for `x` of shape `[.., in]`.
    pub fn forward(&self, x: &B::Storage) -> Result<B::Storage> {
        let mut y = self.forward_no_bias(x)?;
        self.add_bias(&mut y)?;
        Ok(y)
    }

    /// `x @ W`, without the bias.
    pub fn forward_no_bias(&self, x: &B::Storage) -> Result<B::Storage> {
        self.be.matmul(x, &self.weight.value)
    }

    /// Adds the bias (if any) to every row of `y`.
    pub fn add_bias(&self, y: &mut B::Storage) -> Result<()> {
        match &self.bias {
            Some(b) => self.be.add_bias(y, &b.value),
            None => Ok(()),
        }
    }

    /// Input gradient (I): `dy @ W^T`.
    pub fn backward_input(&self, dy: &B::Storage) -> Result<B::Storage> {
        self.be.matmul_nt(dy, &self.weight.value)
    }

    /// Weight gradient (W): `dW += x^T @ dy`, `db += sum(dy)`.
    pub fn backward_weight(&mut self, x: &B::Storage, dy: &B::Storage) -> Result<()> {
        self.be.matmul_tn_acc(x, dy, &mut self.weight.grad)?;
        if let Some(b) = &mut self.bias {
            self.be.bias_grad_acc(dy, &mut b.grad)?;
        }
        Ok(())
    }
}

impl<B: Backend> Parameters<B::Storage> for Linear<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        f(&self.weight);
        if let Some(b) = &self.bias {
            f(b);
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        f(&mut self.weight);
        if let Some(b) = &mut self.bias {
            f(b);
        }
    }
}

/// A TP rank's shard of a linear layer split by output features.
///
/// Rank `r` holds the columns of [`shard_col_segments`] (weight and bias alike), so
/// its forward output is its slice of the full output and needs no
/// communication. Its input gradient is a *partial sum*: the caller
/// all-reduces it over the group.
#[derive(Debug)]
pub struct ColumnParallelLinear<B: Backend = Cpu> {
    /// The local shard as a plain linear layer (`[in, out / tp]`).
    pub local: Linear<B>,
}

super::clone_if_tensors_clone!(ColumnParallelLinear { local });

impl ColumnParallelLinear {
    /// This rank's shard of the full `[in, out]` weight and `[out]` bias;
    /// `groups` equal segments as in [`shard_cols`](super::shard::shard_cols) (1 for a plain
    /// layer, 2 for a gated MLP's fused gate and up, 3 for a multi-head QKV).
    pub fn from_full(
        name: &str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        groups: usize,
        tp: TpShard,
    ) -> Result<Self> {
        Self::from_full_on(&cpu_backend(), name, weight, bias, groups, tp)
    }
}

impl<B: Backend> ColumnParallelLinear<B> {
    /// [`ColumnParallelLinear::from_full`], with the shard uploaded to `be`.
    pub fn from_full_on(
        be: &Arc<B>,
        name: &str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        groups: usize,
        tp: TpShard,
    ) -> Result<Self> {
        // Unequal groups (or none) fail the segments' sum check.
        let segments = vec![weight.cols() / groups.max(1); groups];
        Self::from_segments_on(be, name, weight, bias, &segments, tp)
    }

    /// This rank's shard of a weight whose columns are the consecutive
    /// `segments` (see [`shard_col_segments`]): a grouped-query QKV.
    pub fn from_segments_on(
        be: &Arc<B>,
        name: &str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        segments: &[usize],
        tp: TpShard,
    ) -> Result<Self> {
        let w = shard_col_segments(weight, segments, tp)?;
        let b = bias
            .map(|b| shard_col_segments(b, segments, tp))
            .transpose()?;
        Ok(Self {
            local: Linear::on(be, name, &w, b.as_ref())?,
        })
    }
}

/// A TP rank's shard of a linear layer split by input features.
///
/// Rank `r` holds the rows of [`shard_rows`] and takes its slice of the
/// input (which a preceding column-parallel layer produces). Its forward
/// returns a *partial sum* without bias; the caller all-reduces it and then
/// adds the bias once with [`RowParallelLinear::add_bias`]. The bias is
/// replicated on every rank and its gradient, computed from the replicated
/// output gradient, is identical on every rank. The input gradient needs no
/// communication.
#[derive(Debug)]
pub struct RowParallelLinear<B: Backend = Cpu> {
    /// The local shard (`[in / tp, out]`) with the full, replicated bias.
    pub local: Linear<B>,
}

super::clone_if_tensors_clone!(RowParallelLinear { local });

impl RowParallelLinear {
    /// This rank's shard of the full `[in, out]` weight; the bias is kept whole.
    pub fn from_full(
        name: &str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        tp: TpShard,
    ) -> Result<Self> {
        Self::from_full_on(&cpu_backend(), name, weight, bias, tp)
    }
}

impl<B: Backend> RowParallelLinear<B> {
    /// [`RowParallelLinear::from_full`], with the shard uploaded to `be`.
    pub fn from_full_on(
        be: &Arc<B>,
        name: &str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        tp: TpShard,
    ) -> Result<Self> {
        let w = shard_rows(weight, tp)?;
        Ok(Self {
            local: Linear::on(be, name, &w, bias)?,
        })
    }

    /// The partial sum `x_local @ W_local` (no bias).
    pub fn forward_partial(&self, x: &B::Storage) -> Result<B::Storage> {
        self.local.forward_no_bias(x)
    }

    /// Adds the bias to the reduced output.
    pub fn add_bias(&self, y: &mut B::Storage) -> Result<()> {
        self.local.add_bias(y)
    }
}
