//! The kernels' host layers as [`Layer`]s of a list, each declaring how it runs under
//! tensor parallelism: [`Mlp`] shards (built from a rank's `TpShard`, it sums over the TP
//! group itself), the norms are replicated, and a lone [`Linear`] cannot shard (it would
//! need a partner: the MLP is the column-then-row pair).

use pipewright_kernels::layers::{
    LayerNorm, Linear, Mlp, MlpStash, MlpWeightStash, NoTp, RmsNorm, TpReduce,
};
use pipewright_kernels::{Backend, Cpu, Tensor};

use super::{Layer, TpLayout};
use crate::module::ModuleError;

/// What a host norm keeps for its backward.
type HostNormStash = <Cpu as Backend>::NormStash;

/// `y = x W + b`, kept whole on every TP rank ([`TpLayout::Whole`]: refused under `tp > 1`).
impl Layer for Linear {
    /// The input.
    type Stash = Tensor;
    /// The input and the output gradient.
    type WeightStash = (Tensor, Tensor);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Tensor), ModuleError> {
        let lin: &Linear = self; // the inherent forward, not this one
        Ok((lin.forward(x)?, x.clone()))
    }

    fn backward_input(
        &mut self,
        x: Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, (Tensor, Tensor)), ModuleError> {
        let lin: &Linear = self;
        Ok((lin.backward_input(dy)?, (x, dy.clone())))
    }

    fn backward_weight(&mut self, (x, dy): (Tensor, Tensor)) -> Result<(), ModuleError> {
        Ok(Linear::backward_weight(self, &x, &dy)?)
    }
}

/// The MLP (`fc2(act(fc1(x)))`), sharded as built: `Mlp::from_full(.., shard)` holds the
/// rank's columns of `fc1` and rows of `fc2` and all-reduces its output and its input
/// gradient over the TP group ([`TpLayout::Sharded`]); `TpShard::SINGLE` is the whole MLP.
impl Layer for Mlp {
    type Stash = MlpStash;
    type WeightStash = MlpWeightStash;

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, MlpStash), ModuleError> {
        self.forward_tp(x, &mut NoTp)
    }

    fn backward_input(
        &mut self,
        stash: MlpStash,
        dy: &Tensor,
    ) -> Result<(Tensor, MlpWeightStash), ModuleError> {
        self.backward_input_tp(stash, dy, &mut NoTp)
    }

    fn backward_weight(&mut self, ws: MlpWeightStash) -> Result<(), ModuleError> {
        Ok(Mlp::backward_weight(self, ws)?)
    }

    fn tp_layout(&self) -> TpLayout {
        TpLayout::Sharded
    }

    fn forward_tp(
        &mut self,
        x: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, MlpStash), ModuleError> {
        Ok(Mlp::forward(self, x.clone(), tp)?)
    }

    fn backward_input_tp(
        &mut self,
        stash: MlpStash,
        dy: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, MlpWeightStash), ModuleError> {
        Ok(Mlp::backward_input(self, stash, dy.clone(), tp)?)
    }
}

/// A norm layer of a list: replicated on every TP rank ([`TpLayout::Replicated`]).
macro_rules! norm_layer {
    ($ty:ident) => {
        impl Layer for $ty {
            /// The norm's statistics.
            type Stash = HostNormStash;
            /// The output gradient and the statistics.
            type WeightStash = (Tensor, HostNormStash);

            fn forward(&mut self, x: &Tensor) -> Result<(Tensor, HostNormStash), ModuleError> {
                let norm: &$ty = self;
                Ok(norm.forward(x)?)
            }

            fn backward_input(
                &mut self,
                stash: HostNormStash,
                dy: &Tensor,
            ) -> Result<(Tensor, (Tensor, HostNormStash)), ModuleError> {
                let norm: &$ty = self;
                Ok((norm.backward_input(dy, &stash)?, (dy.clone(), stash)))
            }

            fn backward_weight(
                &mut self,
                (dy, stash): (Tensor, HostNormStash),
            ) -> Result<(), ModuleError> {
                Ok($ty::backward_weight(self, &dy, &stash)?)
            }

            fn tp_layout(&self) -> TpLayout {
                TpLayout::Replicated
            }
        }
    };
}

norm_layer!(LayerNorm);
norm_layer!(RmsNorm);
