//! The in-process transport's data plane: [`LocalOps`], how one rank hands a tensor over,
//! takes one in and combines a round, and [`HostOps`], its host-tensor form.

use pipewright_kernels::Tensor;

use crate::{concat_shards, reduce_in_order, share_of, CommError, ReduceOp};

/// The data plane of the in-process transport, as one rank sees it: how a tensor leaves this
/// rank, how one arrives, and how a round of a collective is combined. Every method runs on
/// the calling rank's thread (and, on a GPU, queues work on that rank's stream).
pub trait LocalOps {
    /// What the ranks exchange.
    type Tensor: pipewright_kernels::Shaped;
    /// A tensor in transit between rank threads (on a GPU: with the event that says its
    /// contents are ready).
    type Message: Send;

    /// Hand `t` over to the transport (sender side).
    fn outgoing(&self, t: Self::Tensor) -> Result<Self::Message, CommError>;
    /// Hand a pipeline payload (a point-to-point send) over: as [`LocalOps::outgoing`],
    /// unless the data plane carries hand-offs in a narrower form ([`LocalOps::incoming`]
    /// must then widen it).
    fn hand_off(&self, t: Self::Tensor) -> Result<Self::Message, CommError> {
        self.outgoing(t)
    }
    /// Make an arrived message this rank's own tensor (receiver side).
    fn incoming(&self, m: Self::Message) -> Result<Self::Tensor, CommError>;
    /// A copy of `t` as a message (all-gather keeps its argument).
    fn duplicate(&self, t: &Self::Tensor) -> Result<Self::Message, CommError>;
    /// The parts of a round, combined in group order (the same order on every rank, so every
    /// rank gets the same bits).
    fn reduce(&self, parts: &[&Self::Message], op: ReduceOp) -> Result<Self::Tensor, CommError>;
    /// Copies of the parts of a round, in group order.
    fn gather(&self, parts: &[&Self::Message]) -> Result<Vec<Self::Tensor>, CommError>;
    /// Position `pos`'s shard of `whole` over `n` ranks, flat
    /// ([`shard_range`](crate::shard_range)).
    fn share(&self, whole: &Self::Tensor, pos: usize, n: usize) -> Result<Self::Tensor, CommError>;
    /// The shards of a round (group order) concatenated into one flat tensor of `numel`
    /// values, each checked against [`shard_range`](crate::shard_range).
    fn concat(&self, parts: &[&Self::Message], numel: usize) -> Result<Self::Tensor, CommError>;
    /// Number of values in `t`.
    fn numel(&self, t: &Self::Tensor) -> usize;
    /// A cheap empty tensor, to stand in for one moved out of a `&mut`.
    fn placeholder(&self) -> Result<Self::Tensor, CommError>;
}

/// Host tensors, moved between threads as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostOps;

impl LocalOps for HostOps {
    type Tensor = Tensor;
    type Message = Tensor;

    fn outgoing(&self, t: Tensor) -> Result<Tensor, CommError> {
        Ok(t)
    }

    fn incoming(&self, m: Tensor) -> Result<Tensor, CommError> {
        Ok(m)
    }

    fn duplicate(&self, t: &Tensor) -> Result<Tensor, CommError> {
        Ok(t.clone())
    }

    fn reduce(&self, parts: &[&Tensor], op: ReduceOp) -> Result<Tensor, CommError> {
        reduce_in_order(parts.iter().copied(), op)
    }

    fn gather(&self, parts: &[&Tensor]) -> Result<Vec<Tensor>, CommError> {
        Ok(parts.iter().map(|&t| t.clone()).collect())
    }

    fn share(&self, whole: &Tensor, pos: usize, n: usize) -> Result<Tensor, CommError> {
        share_of(whole, pos, n)
    }

    fn concat(&self, parts: &[&Tensor], numel: usize) -> Result<Tensor, CommError> {
        concat_shards(parts.iter().copied(), numel)
    }

    fn numel(&self, t: &Tensor) -> usize {
        t.numel()
    }

    fn placeholder(&self) -> Result<Tensor, CommError> {
        Ok(Tensor::zeros(&[0]))
    }
}
