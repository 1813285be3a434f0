//! The initial weights of the reference GPT's mixtures of experts.

use super::{GptConfig, GptStage, MoeSpec};
use crate::backend::Backend;
use crate::error::Result;
use crate::init::normal_tensor;
use crate::layers::{FeedForward, Mlp, MlpKindExt, Moe, MoeConfig, TpShard};
use crate::tensor::Tensor;
use std::sync::Arc;

/// One expert's full weights, drawn as the dense MLP's are (std 0.02, the down
/// projection scaled as a residual one), cut for TP rank `tp`.
fn init_expert<B: Backend>(
    be: &Arc<B>,
    cfg: &GptConfig,
    (seed, name): (u64, &str),
    f: usize,
    tp: TpShard,
) -> Result<Mlp<B>> {
    let d = cfg.d_model;
    let resid = 0.02 / (2.0 * cfg.n_layers as f32).sqrt();
    let w = |n: &str, shape: &[usize], std| normal_tensor(shape, std, seed, &format!("{name}.{n}"));
    let (w1, w2) = match cfg.mlp.glu() {
        None => (
            w("fc1.weight", &[d, f], 0.02),
            w("fc2.weight", &[f, d], resid),
        ),
        Some(_) => {
            let (g, u) = (
                w("gate.weight", &[d, f], 0.02),
                w("up.weight", &[d, f], 0.02),
            );
            (
                Tensor::concat_cols(&[&g, &u])?,
                w("down.weight", &[f, d], resid),
            )
        }
    };
    let zeros = |n: usize| cfg.bias.rest().then(|| Tensor::zeros(&[n]));
    let (b1, b2) = (zeros(w1.cols()), zeros(d));
    Mlp::from_fused_on(
        be,
        name,
        cfg.mlp,
        (&w1, b1.as_ref()),
        (&w2, b2.as_ref()),
        tp,
    )
}

/// The mixture of block `l` (parameters `blocks.{l}.mlp.router`, `.experts.{e}`, `.shared`).
pub(super) fn init_moe<B: Backend>(
    be: &Arc<B>,
    cfg: &GptConfig,
    spec: &MoeSpec,
    (seed, l): (u64, usize),
    tp: TpShard,
) -> Result<Moe<B>> {
    let name = format!("blocks.{l}.mlp");
    let experts = (0..spec.experts)
        .map(|e| {
            init_expert(
                be,
                cfg,
                (seed, &format!("{name}.experts.{e}")),
                spec.d_ff,
                tp,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let shared = (spec.shared_d_ff > 0)
        .then(|| {
            init_expert(
                be,
                cfg,
                (seed, &format!("{name}.shared")),
                spec.shared_d_ff,
                tp,
            )
        })
        .transpose()?;
    let router = normal_tensor(
        &[cfg.d_model, spec.experts],
        0.02,
        seed,
        &format!("{name}.router.weight"),
    );
    let routing = MoeConfig {
        top_k: spec.top_k,
        aux_coef: spec.aux_coef,
    };
    Moe::on(be, &name, &router, experts, shared, routing)
}

impl<B: Backend> GptStage<B> {
    /// Keeps expert-parallel rank `ep`'s share of every mixture's experts (rank `r` of `n`
    /// the `r`-th contiguous `E / n`); the router, attention and shared expert stay whole.
    /// The stage's forward and backward then need a TP group that offers the EP group's
    /// all-to-all ([`crate::layers::TpReduce::expert_exchange`]).
    pub fn shard_experts(&mut self, ep: TpShard) -> Result<()> {
        for b in &mut self.blocks {
            if let FeedForward::Moe(m) = &mut b.mlp {
                m.shard_experts(ep)?;
            }
        }
        Ok(())
    }
}
