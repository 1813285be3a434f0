//! The model-shape flags every command that takes a shape shares (`plan`, `simulate`,
//! `search`, `train`): the kinds beyond GPT-2's (key/value heads, the MLP's kind and width,
//! the norm, tied embeddings, positions, biases, a mixture of experts), `--hf-config` (a Hugging Face
//! `config.json`) and the run's `--attention`. The names, defaults and checks are the schedule
//! crate's (`pipewright::schedule::shape::request`, which the Python package calls too), so
//! every command, and Python, reads a shape the same way.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use pipewright::schedule::shape::{
    AttentionKind, BiasKind, MlpKind, MoeKinds, Named, NormKind, PositionKind, RopeTheta,
    ShapeKinds,
};

use super::io::{read_text, FileKind};

/// Parses a kind by its schedule-crate name (the error lists the names).
pub fn parse_kind<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T, String> {
    s.parse()
}

/// The kinds of a shape beyond its sizes; each defaults to the reference GPT's (GPT-2's).
#[derive(Args, Debug, Clone, Default)]
pub struct ShapeArgs {
    /// MLP hidden width [default: 4 * --d-model; for a gated --mlp, 8/3 of --d-model
    /// rounded up to a multiple of 256, as Llama's reference code does].
    #[arg(long, value_name = "F", help_heading = "Model shape")]
    pub ffn: Option<u64>,
    /// Key/value heads: fewer than --heads is grouped-query attention, 1 multi-query
    /// [default: --heads]. Must divide --heads (and be divisible by --tp).
    #[arg(long, value_name = "N", help_heading = "Model shape")]
    pub kv_heads: Option<u32>,
    /// The MLP: gelu (two matrices), swiglu or geglu (gated: three matrices of width --ffn)
    /// [default: gelu].
    #[arg(long, value_name = "KIND", value_parser = parse_kind::<MlpKind>, help_heading = "Model shape")]
    pub mlp: Option<MlpKind>,
    /// The norm: layernorm (gain and bias) or rmsnorm (gain only) [default: layernorm].
    #[arg(long, value_name = "KIND", value_parser = parse_kind::<NormKind>, help_heading = "Model shape")]
    pub norm: Option<NormKind>,
    /// The LM head reuses the token embedding's matrix (GPT-2); without it the two are
    /// separate matrices (Llama; the reference GPT).
    #[arg(long, help_heading = "Model shape")]
    pub tied_embeddings: bool,
    /// Positions: learned (a table of --seq-len rows) or rotary (no parameters)
    /// [default: learned].
    #[arg(long, value_name = "KIND", value_parser = parse_kind::<PositionKind>, help_heading = "Model shape")]
    pub positions: Option<PositionKind>,
    /// The base of rotary positions' angles (Hugging Face's rope_theta: 500000 in Llama 3,
    /// 1000000 in Qwen2); with --positions rotary only [default: 10000].
    #[arg(long, value_name = "THETA", value_parser = parse_kind::<RopeTheta>, help_heading = "Model shape")]
    pub rope_theta: Option<RopeTheta>,
    /// Biases of the linear layers: all, qkv (Qwen2) or none (Llama) [default: all].
    #[arg(long, value_name = "KIND", value_parser = parse_kind::<BiasKind>, help_heading = "Model shape")]
    pub bias: Option<BiasKind>,
    /// Routed experts of a mixture-of-experts layer: its MLP is this many experts of the
    /// --mlp kind, without biases, and a router (a d_model x experts matrix) [default: a
    /// dense model].
    #[arg(long, value_name = "E", help_heading = "Mixture of experts")]
    pub experts: Option<u32>,
    /// Routed experts each token goes to; at most --experts (required with it).
    #[arg(long, value_name = "K", help_heading = "Mixture of experts")]
    pub top_k: Option<u32>,
    /// Hidden width of one expert [default: --ffn].
    #[arg(long, value_name = "F", help_heading = "Mixture of experts")]
    pub expert_ffn: Option<u64>,
    /// Experts every token goes to beside the routed ones (DeepSeek's shared experts)
    /// [default: 0].
    #[arg(long, value_name = "N", help_heading = "Mixture of experts")]
    pub shared_experts: Option<u32>,
    /// Hidden width of one shared expert [default: --expert-ffn].
    #[arg(long, value_name = "F", help_heading = "Mixture of experts")]
    pub shared_ffn: Option<u64>,
    /// Dense layers (an MLP of --ffn) before the first mixture-of-experts layer
    /// (DeepSeek's first_k_dense_replace) [default: 0].
    #[arg(long, value_name = "N", help_heading = "Mixture of experts")]
    pub dense_layers: Option<u32>,
    /// After the dense layers, one layer in this many is a mixture-of-experts layer, the
    /// last of each group (Qwen-MoE's decoder_sparse_step) [default: 1].
    #[arg(long, value_name = "N", help_heading = "Mixture of experts")]
    pub moe_every: Option<u32>,
    /// Group-limited routing (DeepSeek's n_group): the routed experts fall into this many
    /// equal groups, one a node in DeepSeek-V3 [default: none]. Needs --groups-per-token.
    #[arg(long, value_name = "G", help_heading = "Mixture of experts")]
    pub expert_groups: Option<u32>,
    /// Group-limited routing (DeepSeek's topk_group): a token's experts come from this many
    /// of the --expert-groups, so its dispatch reaches at most this many groups' nodes.
    #[arg(long, value_name = "M", help_heading = "Mixture of experts")]
    pub groups_per_token: Option<u32>,
}

impl ShapeArgs {
    /// The kinds as the library's request takes them.
    pub fn kinds(&self) -> ShapeKinds {
        ShapeKinds {
            ffn: self.ffn,
            kv_heads: self.kv_heads,
            mlp: self.mlp,
            norm: self.norm,
            tied_embeddings: self.tied_embeddings,
            positions: self.positions,
            rope_theta: self.rope_theta,
            bias: self.bias,
            moe: MoeKinds {
                experts: self.experts,
                top_k: self.top_k,
                expert_ffn: self.expert_ffn,
                shared_experts: self.shared_experts,
                shared_ffn: self.shared_ffn,
                dense_layers: self.dense_layers,
                every: self.moe_every,
                expert_groups: self.expert_groups,
                groups_per_token: self.groups_per_token,
            },
        }
    }
}

/// The run's attention kind, parsed by name.
pub fn parse_attention(s: &str) -> Result<AttentionKind, String> {
    s.parse()
}

/// A Hugging Face config.json's text, named by its path for the library's errors.
pub fn hf_source(path: Option<&PathBuf>) -> Result<Option<Named>> {
    path.map(|p| {
        let (name, text) = (p.display().to_string(), read_text(p)?);
        pipewright::input::expect_kind(&name, &text, FileKind::HfConfig)?;
        Ok(Named { name, text })
    })
    .transpose()
}
