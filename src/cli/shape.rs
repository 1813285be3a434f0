//! The model-shape flags every command that takes a shape shares (`plan`, `simulate`,
//! `search`, `train`): the kinds beyond GPT-2's (key/value heads, the MLP's kind and width,
//! the norm, tied embeddings, positions, biases), `--hf-config` (a Hugging Face
//! `config.json`) and the run's `--attention`. The names and defaults are the schedule
//! crate's (`pipewright::schedule::shape`), so every command reads a shape the same way.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use pipewright::schedule::shape::hf::{from_hf_config, HfModel};
use pipewright::schedule::shape::{
    AttentionKind, BiasKind, MlpKind, ModelShape, NormKind, PositionKind, RopeTheta, ShapeError,
};

use super::io::read_text;

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
}

impl ShapeArgs {
    /// The flags given on the command line, by name.
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--ffn", self.ffn.is_some()),
            ("--kv-heads", self.kv_heads.is_some()),
            ("--mlp", self.mlp.is_some()),
            ("--norm", self.norm.is_some()),
            ("--tied-embeddings", self.tied_embeddings),
            ("--positions", self.positions.is_some()),
            ("--rope-theta", self.rope_theta.is_some()),
            ("--bias", self.bias.is_some()),
        ]
        .into_iter()
        .filter(|f| f.1)
        .map(|f| f.0)
        .collect()
    }

    /// The shape of these sizes with these kinds, checked (errors name the flags).
    pub fn shape(
        &self,
        layers: u32,
        d_model: u64,
        heads: u32,
        seq_len: u64,
        vocab: u64,
    ) -> Result<ModelShape> {
        let mlp = self.mlp.unwrap_or_default();
        let positions = self.positions.unwrap_or_default();
        if self.rope_theta.is_some() && positions != PositionKind::Rotary {
            bail!("--rope-theta is the base of rotary positions: also give --positions rotary");
        }
        let shape = ModelShape {
            layers,
            d_model,
            heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            ffn: self.ffn.unwrap_or_else(|| mlp.default_ffn(d_model)),
            seq_len,
            vocab,
            mlp,
            norm: self.norm.unwrap_or_default(),
            tied_embeddings: self.tied_embeddings,
            positions,
            rope_theta: self.rope_theta.unwrap_or_default(),
            bias: self.bias.unwrap_or_default(),
        };
        shape.check().map_err(|e| anyhow!("{}", flag_error(&e)))?;
        Ok(shape)
    }
}

/// A shape's error with flag names for field names.
pub fn flag_error(e: &ShapeError) -> String {
    let flag = |name: &str| format!("--{}", name.replace('_', "-"));
    match e {
        ShapeError::NotPositive(name) => format!("{} must be at least 1", flag(name)),
        ShapeError::NotDividing { a, x, b, y } => {
            format!("{} {x} must divide {} {y}", flag(a), flag(b))
        }
        ShapeError::OddRotaryHead(w) => format!(
            "--positions rotary turns pairs of a head's dimensions: the head width {w} (--d-model / --heads) is not even"
        ),
    }
}

/// The run's attention kind, parsed by name.
pub fn parse_attention(s: &str) -> Result<AttentionKind, String> {
    s.parse()
}

/// A Hugging Face config.json as a shape, its sequence length replaced by `seq_len` where
/// given; errors name the file.
pub fn read_hf_config(path: &Path, seq_len: Option<u64>) -> Result<HfModel> {
    let text = read_text(path)?;
    let mut model =
        from_hf_config(&text).map_err(|e| anyhow!("--hf-config {}: {e}", path.display()))?;
    if let Some(s) = seq_len {
        if s == 0 {
            bail!("--seq-len must be at least 1");
        }
        model.shape.seq_len = s;
        model.seq_len_field = "--seq-len";
    }
    Ok(model)
}

/// What a user should know of how `model` was read from `path`: where its sequence length
/// came from, and what the config has that is not modelled; one line each, for stderr after
/// the work succeeded.
pub fn hf_notes(path: &Path, model: &HfModel) -> Vec<String> {
    let mut out = Vec::new();
    if model.seq_len_field != "--seq-len" {
        out.push(format!(
            "note: --hf-config {}: sequence {} from its {} (--seq-len plans another)",
            path.display(),
            model.shape.seq_len,
            model.seq_len_field
        ));
    }
    for note in &model.notes {
        out.push(format!("note: --hf-config {}: {note}", path.display()));
    }
    out
}

/// The shape in one phrase: sizes, then the kinds that differ from GPT-2's.
pub fn describe(s: &ModelShape) -> String {
    let mut out = format!(
        "{} layers x d_model {} x {} heads",
        s.layers, s.d_model, s.heads
    );
    if s.kv_heads != s.heads {
        out += &format!(" ({} kv)", s.kv_heads);
    }
    out += &format!(", {} {}", s.mlp, s.ffn);
    if s.norm != NormKind::LayerNorm {
        out += &format!(", {}", s.norm);
    }
    if s.positions != PositionKind::Learned {
        out += &format!(", {}", s.positions);
    }
    if s.tied_embeddings {
        out += ", tied";
    }
    if s.bias != BiasKind::All {
        out += &format!(", bias {}", s.bias);
    }
    out += &format!(", vocab {}, seq {}", s.vocab, s.seq_len);
    out
}

/// The flags that give `train` (or any command) this shape's kinds: those that differ from
/// the defaults, in flag form.
pub fn kind_flags(s: &ModelShape) -> String {
    let mut out = String::new();
    if s.ffn != s.mlp.default_ffn(s.d_model) {
        out += &format!(" --ffn {}", s.ffn);
    }
    if s.kv_heads != s.heads {
        out += &format!(" --kv-heads {}", s.kv_heads);
    }
    if s.mlp != MlpKind::Gelu {
        out += &format!(" --mlp {}", s.mlp);
    }
    if s.norm != NormKind::LayerNorm {
        out += &format!(" --norm {}", s.norm);
    }
    if s.tied_embeddings {
        out += " --tied-embeddings";
    }
    if s.positions != PositionKind::Learned {
        out += &format!(" --positions {}", s.positions);
        if s.rope_theta != RopeTheta::DEFAULT {
            out += &format!(" --rope-theta {}", s.rope_theta);
        }
    }
    if s.bias != BiasKind::All {
        out += &format!(" --bias {}", s.bias);
    }
    out
}
