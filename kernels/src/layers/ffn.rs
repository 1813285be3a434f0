//! A block's feed-forward part: the dense [`Mlp`] or a mixture of experts ([`Moe`]), with
//! one face so the block runs either.

use super::mlp::{Mlp, MlpStash, MlpWeightStash};
use super::moe::{Moe, MoeStash, MoeWeightStash};
use super::shard::TpShard;
use super::{Param, Parameters, TpReduce};
use crate::backend::Backend;
use crate::cpu::Cpu;
use crate::error::{KernelError, Result};
use crate::footprint::Footprint;

/// The feed-forward layer of a block.
#[derive(Debug)]
pub enum FeedForward<B: Backend = Cpu> {
    /// One MLP (plain or gated).
    Dense(Mlp<B>),
    /// Routed experts, maybe with a shared one.
    Moe(Moe<B>),
}

/// What a feed-forward layer's input backward needs.
#[derive(Debug)]
pub enum FfnStash<B: Backend = Cpu> {
    /// The MLP's.
    Dense(MlpStash<B>),
    /// The mixture's (boxed: it holds the routing and the dispatch layout besides).
    Moe(Box<MoeStash<B>>),
}

/// What a feed-forward layer's weight backward needs.
#[derive(Debug)]
pub enum FfnWeightStash<B: Backend = Cpu> {
    /// The MLP's.
    Dense(MlpWeightStash<B>),
    /// The mixture's.
    Moe(MoeWeightStash<B>),
}

/// `Clone` for an enum of backend-generic parts whenever the backend's tensors are
/// (as `clone_if_tensors_clone!` for structs).
macro_rules! clone_enum {
    ($ty:ident { $($variant:ident),* }) => {
        impl<B: Backend> Clone for $ty<B>
        where
            B::Storage: Clone,
            B::NormStash: Clone,
            B::AttnStash: Clone,
            B::Kept: Clone,
        {
            fn clone(&self) -> Self {
                match self {
                    $($ty::$variant(x) => $ty::$variant(x.clone()),)*
                }
            }
        }
    };
}

clone_enum!(FeedForward { Dense, Moe });
clone_enum!(FfnStash { Dense, Moe });
clone_enum!(FfnWeightStash { Dense, Moe });

impl<B: Backend> Footprint for FfnStash<B> {
    fn bytes(&self) -> usize {
        match self {
            FfnStash::Dense(s) => s.bytes(),
            FfnStash::Moe(s) => s.bytes(),
        }
    }
}

impl<B: Backend> Footprint for FfnWeightStash<B> {
    fn bytes(&self) -> usize {
        match self {
            FfnWeightStash::Dense(s) => s.bytes(),
            FfnWeightStash::Moe(s) => s.bytes(),
        }
    }
}

impl<B: Backend> Parameters<B::Storage> for FeedForward<B> {
    fn visit(&self, f: &mut dyn FnMut(&Param<B::Storage>)) {
        match self {
            FeedForward::Dense(m) => m.visit(f),
            FeedForward::Moe(m) => m.visit(f),
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param<B::Storage>)) {
        match self {
            FeedForward::Dense(m) => m.visit_mut(f),
            FeedForward::Moe(m) => m.visit_mut(f),
        }
    }
}

fn no_seq() -> KernelError {
    KernelError::Config(
        "sequence parallelism is not implemented for mixture-of-experts blocks".into(),
    )
}

impl<B: Backend> FeedForward<B> {
    /// The dense MLP, if this is one.
    pub fn dense(&self) -> Option<&Mlp<B>> {
        match self {
            FeedForward::Dense(m) => Some(m),
            FeedForward::Moe(_) => None,
        }
    }

    /// Forward, or sequence-parallel with `sp` (dense only).
    pub fn forward_seq(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        sp: Option<TpShard>,
    ) -> Result<(B::Storage, FfnStash<B>)> {
        match (self, sp) {
            (FeedForward::Dense(m), Some(shard)) => {
                let (y, s) = m.forward_seq(x, tp, shard)?;
                Ok((y, FfnStash::Dense(s)))
            }
            (FeedForward::Dense(m), None) => {
                let (y, s) = m.forward(x, tp)?;
                Ok((y, FfnStash::Dense(s)))
            }
            (FeedForward::Moe(m), None) => {
                let (y, s) = m.forward(x, tp)?;
                Ok((y, FfnStash::Moe(Box::new(s))))
            }
            (FeedForward::Moe(_), Some(_)) => Err(no_seq()),
        }
    }

    /// Input backward of a [`FeedForward::forward_seq`] with the same `sp`.
    pub fn backward_input_seq(
        &self,
        stash: FfnStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        sp: Option<TpShard>,
    ) -> Result<(B::Storage, FfnWeightStash<B>)> {
        match (self, stash, sp) {
            (FeedForward::Dense(m), FfnStash::Dense(s), Some(shard)) => {
                let (dx, w) = m.backward_input_seq(s, dy, tp, shard)?;
                Ok((dx, FfnWeightStash::Dense(w)))
            }
            (FeedForward::Dense(m), FfnStash::Dense(s), None) => {
                let (dx, w) = m.backward_input(s, dy, tp)?;
                Ok((dx, FfnWeightStash::Dense(w)))
            }
            (FeedForward::Moe(m), FfnStash::Moe(s), None) => {
                let (dx, w) = m.backward_input(*s, dy, tp)?;
                Ok((dx, FfnWeightStash::Moe(w)))
            }
            (FeedForward::Moe(_), _, Some(_)) => Err(no_seq()),
            _ => Err(KernelError::Config(
                "a feed-forward stash from another kind of layer".into(),
            )),
        }
    }

    /// Weight backward.
    pub fn backward_weight(&mut self, ws: FfnWeightStash<B>) -> Result<()> {
        match (self, ws) {
            (FeedForward::Dense(m), FfnWeightStash::Dense(w)) => m.backward_weight(w),
            (FeedForward::Moe(m), FfnWeightStash::Moe(w)) => m.backward_weight(w),
            _ => Err(KernelError::Config(
                "a feed-forward weight stash from another kind of layer".into(),
            )),
        }
    }
}

impl<B: Backend> From<Mlp<B>> for FeedForward<B> {
    fn from(m: Mlp<B>) -> Self {
        FeedForward::Dense(m)
    }
}

impl<B: Backend> From<Moe<B>> for FeedForward<B> {
    fn from(m: Moe<B>) -> Self {
        FeedForward::Moe(m)
    }
}
