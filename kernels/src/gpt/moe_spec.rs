//! The reference GPT's mixture-of-experts layers: which blocks have one, their sizes and
//! their parameter count.

use crate::error::{KernelError, Result};
use crate::layers::{MlpKind, MlpKindExt};

/// The mixture of experts that replaces the MLP of some blocks (DeepSeek-V3's and
/// Qwen-MoE's layout: `dense_first` dense blocks, then a mixture every `every` blocks).
/// Each expert is an MLP of the config's kind and bias.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden width of each routed expert.
    pub d_ff: usize,
    /// Hidden width of the shared expert (0: none).
    pub shared_d_ff: usize,
    /// Dense blocks before the first mixture.
    pub dense_first: usize,
    /// After the dense blocks, one block in `every` has a mixture, the last of each run of
    /// `every` (1: all of them), as `pipewright-model`'s shapes and Qwen2-MoE's
    /// `decoder_sparse_step` count them.
    pub every: usize,
    /// The load-balancing loss's coefficient, applied per microbatch forward.
    pub aux_coef: f32,
}

impl MoeSpec {
    /// `experts` experts of width `d_ff`, top-`top_k`, in every block, no shared expert,
    /// Switch's coefficient 0.01.
    pub fn new(experts: usize, top_k: usize, d_ff: usize) -> Self {
        Self {
            experts,
            top_k,
            d_ff,
            shared_d_ff: 0,
            dense_first: 0,
            every: 1,
            aux_coef: 0.01,
        }
    }

    /// Whether block `l` has a mixture in place of its MLP.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        l >= self.dense_first && (l - self.dense_first + 1) % self.every.max(1) == 0
    }

    /// Errors unless the sizes are positive, `top_k <= experts`, and `tp` divides the
    /// experts' widths (each expert is cut like the MLP).
    pub fn validate(&self, tp: usize) -> Result<()> {
        let bad = |m: String| Err(KernelError::Config(format!("moe: {m}")));
        for (name, v) in [
            ("experts", self.experts),
            ("d_ff", self.d_ff),
            ("every", self.every),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return bad(format!(
                "top_k {} must be 1..={} (the experts)",
                self.top_k, self.experts
            ));
        }
        if !(self.aux_coef.is_finite() && self.aux_coef >= 0.0) {
            return bad(format!(
                "aux_coef {} must be finite and >= 0",
                self.aux_coef
            ));
        }
        if self.d_ff % tp != 0 || self.shared_d_ff % tp != 0 {
            return bad(format!(
                "tensor-parallel size {tp} must divide d_ff ({}) and shared_d_ff ({})",
                self.d_ff, self.shared_d_ff
            ));
        }
        Ok(())
    }

    /// Parameters of one mixture (router, experts, shared expert) of width `d` whose
    /// experts are MLPs of `kind`, with biases or not.
    pub fn layer_params(&self, d: usize, kind: MlpKind, b: bool) -> usize {
        let mlp = |f: usize| {
            let up = kind.fc1_width() * f;
            d * up + f * d + if b { up + d } else { 0 }
        };
        let shared = if self.shared_d_ff > 0 {
            mlp(self.shared_d_ff)
        } else {
            0
        };
        d * self.experts + self.experts * mlp(self.d_ff) + shared
    }
}
