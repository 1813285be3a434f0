//! Building a stage: each block's, the embedding's and the head's initial
//! weights, drawn whole from their own streams and cut for the TP rank, so
//! any split of a config and seed holds exactly the numbers of the whole model.

use super::{partition, GptConfig, GptStage, Positions};
use crate::backend::Backend;
use crate::cpu::rotary_table;
use crate::error::{KernelError, Result};
use crate::init::normal_tensor;
use crate::layers::{
    cpu_backend, Attention, Block, Embedding, FeedForward, Linear, LmHead, Mlp, MlpKindExt, Norm,
    TpShard,
};
use crate::tensor::Tensor;
use std::ops::Range;
use std::sync::Arc;

/// The full (unsharded) initial weights of block `l`, drawn from their own
/// streams: GPT-2's scheme (std 0.02, residual projections scaled down by
/// `sqrt(2 * n_layers)`, zero biases where the config has them). A gated MLP
/// draws its gate, up and down weights the same way (`down` is the residual
/// projection).
fn init_block<B: Backend>(
    be: &Arc<B>,
    cfg: &GptConfig,
    (seed, l): (u64, usize),
    rotary: Option<&Arc<B::Storage>>,
    tp: TpShard,
) -> Result<Block<B>> {
    let (d, f) = (cfg.d_model, cfg.d_ff);
    let p = |n: &str| format!("blocks.{l}.{n}");
    let resid = 0.02 / (2.0 * cfg.n_layers as f32).sqrt();
    let q = cfg.qkv_width();
    let w_qkv = normal_tensor(&[d, q], 0.02, seed, &p("attn.qkv.weight"));
    let w_o = normal_tensor(&[d, d], resid, seed, &p("attn.proj.weight"));
    let zeros = |on: bool, n: usize| on.then(|| Tensor::zeros(&[n]));
    let (b_qkv, b_o) = (zeros(cfg.bias.qkv(), q), zeros(cfg.bias.rest(), d));
    let qkv = (&w_qkv, b_qkv.as_ref());
    let out = (&w_o, b_o.as_ref());
    let mut attn = Attention::grouped_from_full_on(be, &p("attn"), cfg.heads(), qkv, out, tp)?;
    if let Some(table) = rotary {
        attn = attn.with_rotary(table.clone())?;
    }
    // GeLU's fc1 and fc2, or the gated MLP's gate and up (fused) and down.
    let w1 = match cfg.mlp.glu() {
        None => normal_tensor(&[d, f], 0.02, seed, &p("mlp.fc1.weight")),
        Some(_) => Tensor::concat_cols(&[
            &normal_tensor(&[d, f], 0.02, seed, &p("mlp.gate.weight")),
            &normal_tensor(&[d, f], 0.02, seed, &p("mlp.up.weight")),
        ])?,
    };
    let w2_name = if cfg.mlp.glu().is_some() {
        "down"
    } else {
        "fc2"
    };
    let w2 = normal_tensor(&[f, d], resid, seed, &p(&format!("mlp.{w2_name}.weight")));
    let b1 = zeros(cfg.bias.rest(), w1.cols());
    let (fc1, fc2) = ((&w1, b1.as_ref()), (&w2, b_o.as_ref()));
    let mlp = match &cfg.moe {
        Some(spec) if spec.is_moe_layer(l) => {
            FeedForward::Moe(super::moe::init_moe(be, cfg, spec, (seed, l), tp)?)
        }
        _ => FeedForward::Dense(Mlp::from_fused_on(be, &p("mlp"), cfg.mlp, fc1, fc2, tp)?),
    };
    Ok(Block {
        ln1: Norm::on(be, cfg.norm, &p("ln1"), d)?,
        attn,
        ln2: Norm::on(be, cfg.norm, &p("ln2"), d)?,
        mlp,
    })
}

impl GptStage {
    /// Stage `stage` of `stages` (blocks cut by [`partition`]) as TP rank
    /// `tp`, initialised from `seed`. Any split of the same config and seed
    /// holds exactly the numbers of the whole model.
    pub fn new(
        cfg: &GptConfig,
        seed: u64,
        stage: usize,
        stages: usize,
        tp: TpShard,
    ) -> Result<Self> {
        Self::on(&cpu_backend(), cfg, seed, stage, stages, tp)
    }

    /// The whole model on one device.
    pub fn whole(cfg: &GptConfig, seed: u64) -> Result<Self> {
        Self::new(cfg, seed, 0, 1, TpShard::SINGLE)
    }

    /// A stage with an explicit block range (for uneven cuts); `index` only
    /// labels errors. `first` adds the embedding, `last` the head.
    pub fn with_layers(
        cfg: &GptConfig,
        seed: u64,
        index: usize,
        layers: Range<usize>,
        first: bool,
        last: bool,
        tp: TpShard,
    ) -> Result<Self> {
        let ends = (first, last);
        Self::with_layers_on(&cpu_backend(), cfg, seed, index, layers, ends, tp)
    }
}

impl<B: Backend> GptStage<B> {
    /// [`GptStage::new`] on backend `be`: the same weights, drawn on the
    /// host from `seed` and uploaded, so a device stage starts exactly
    /// where the CPU one does.
    pub fn on(
        be: &Arc<B>,
        cfg: &GptConfig,
        seed: u64,
        stage: usize,
        stages: usize,
        tp: TpShard,
    ) -> Result<Self> {
        let ranges = partition(cfg.n_layers, stages)?;
        let layers = ranges.get(stage).cloned().ok_or_else(|| {
            KernelError::Config(format!("stage {stage} of a {stages}-stage pipeline"))
        })?;
        let ends = (stage == 0, stage + 1 == stages);
        Self::with_layers_on(be, cfg, seed, stage, layers, ends, tp)
    }

    /// [`GptStage::with_layers`] on backend `be`; `ends` is `(first, last)`.
    pub fn with_layers_on(
        be: &Arc<B>,
        cfg: &GptConfig,
        seed: u64,
        index: usize,
        layers: Range<usize>,
        ends: (bool, bool),
        tp: TpShard,
    ) -> Result<Self> {
        let (first, last) = ends;
        cfg.validate(tp.size)?;
        if layers.end > cfg.n_layers || layers.start > layers.end {
            return Err(KernelError::Config(format!(
                "layers {layers:?} of a {}-layer model",
                cfg.n_layers
            )));
        }
        let (d, v) = (cfg.d_model, cfg.vocab);
        let embed = if first {
            let wte = normal_tensor(&[v, d], 0.02, seed, "embed.wte");
            let wpe = match cfg.positions {
                Positions::Learned => {
                    Some(normal_tensor(&[cfg.seq_len, d], 0.01, seed, "embed.wpe"))
                }
                Positions::Rotary { .. } => None,
            };
            Some(Embedding::on(be, "embed", &wte, wpe.as_ref())?)
        } else {
            None
        };
        // One rotary table for the stage's blocks (positions up to the config's sequence).
        let rotary = match cfg.positions {
            Positions::Rotary { theta } if !layers.is_empty() => {
                let table = rotary_table(cfg.seq_len, cfg.head_dim(), theta)?;
                Some(Arc::new(be.upload(&table)?))
            }
            _ => None,
        };
        let blocks = layers
            .clone()
            .map(|l| init_block(be, cfg, (seed, l), rotary.as_ref(), tp))
            .collect::<Result<Vec<_>>>()?;
        let head = if last {
            let w = normal_tensor(&[d, v], 0.02, seed, "head.proj.weight");
            let bias = cfg.bias.rest().then(|| Tensor::zeros(&[v]));
            let proj = Linear::on(be, "head.proj", &w, bias.as_ref())?;
            Some(LmHead {
                ln_f: Norm::on(be, cfg.norm, "head.ln_f", d)?,
                proj,
            })
        } else {
            None
        };
        Ok(Self {
            cfg: *cfg,
            index,
            layers,
            embed,
            blocks,
            head,
            be: be.clone(),
            sp: None,
        })
    }
}
