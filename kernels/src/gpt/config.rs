//! The reference GPT's configuration, its validation and its cut into stages.

use super::moe_spec::MoeSpec;
use crate::cpu::rotary::{check_config, DEFAULT_THETA};
use crate::error::{KernelError, Result};
use crate::layers::{Heads, MlpKind, MlpKindExt, NormKind};
use std::ops::Range;

/// Sizes of the reference GPT.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest sequence (rows of the position table, or of the rotary table).
    pub seq_len: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention (query) heads (must divide `d_model`).
    pub n_heads: usize,
    /// Key/value heads: `n_heads` for multi-head attention, a divisor of it for
    /// grouped-query attention, 1 for multi-query.
    pub kv_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// MLP hidden width (GPT-2 uses `4 * d_model`; a gated MLP's gate and up
    /// projections are each this wide, Llama's about `8/3 * d_model`).
    pub d_ff: usize,
    /// The MLP's form: GeLU (GPT-2), or gated by SiLU or GeLU.
    pub mlp: MlpKind,
    /// The blocks' and the final norm's kind.
    pub norm: NormKind,
    /// Which linear layers have biases.
    pub bias: BiasKind,
    /// How positions enter: a learned table (GPT-2) or rotary embeddings (Llama).
    pub positions: Positions,
    /// Mixtures of experts in place of some blocks' MLPs; `None`: a dense model.
    pub moe: Option<MoeSpec>,
}

/// How positions enter the reference GPT.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Positions {
    /// A learned table of `seq_len` rows added to the token embedding (GPT-2).
    #[default]
    Learned,
    /// Rotary embeddings of every query and key head (Su et al. 2021, in Hugging Face's
    /// rotate-half pairing: [`crate::cpu::rotary`]) with angles `p * theta^(-2i/head_dim)`:
    /// no parameters. Llama 2 and Mistral 7B v0.1 use `theta` 10000, Llama 3 500000.
    Rotary {
        /// The base of the angles (Hugging Face's `rope_theta`).
        theta: f64,
    },
}

impl Positions {
    /// Rotary positions with the default base, 10000.
    pub const ROTARY: Positions = Positions::Rotary {
        theta: DEFAULT_THETA,
    };
}

/// Which linear layers of the model have biases (norms have theirs by their kind): the
/// shared kind of `pipewright-kinds`.
pub use pipewright_kinds::BiasKind;

impl GptConfig {
    /// GPT-2's shape: multi-head attention, a GeLU MLP with `d_ff = 4 * d_model`,
    /// LayerNorm.
    pub fn new(
        vocab: usize,
        seq_len: usize,
        d_model: usize,
        n_heads: usize,
        n_layers: usize,
    ) -> Self {
        Self {
            vocab,
            seq_len,
            d_model,
            n_heads,
            kv_heads: n_heads,
            n_layers,
            d_ff: 4 * d_model,
            mlp: MlpKind::Gelu,
            norm: NormKind::LayerNorm,
            bias: BiasKind::All,
            positions: Positions::Learned,
            moe: None,
        }
    }

    /// The attention's query and key/value heads.
    pub fn heads(&self) -> Heads {
        Heads {
            query: self.n_heads,
            kv: self.kv_heads,
        }
    }

    /// Errors unless every size is positive, the heads divide `d_model`, the
    /// key/value heads divide the heads, and `tp` divides the key/value heads
    /// (then the heads too; as Megatron requires of its query groups) and `d_ff`.
    pub fn validate(&self, tp: usize) -> Result<()> {
        let sizes = [
            ("vocab", self.vocab),
            ("seq_len", self.seq_len),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("kv_heads", self.kv_heads),
            ("n_layers", self.n_layers),
            ("d_ff", self.d_ff),
            ("tensor-parallel size", tp),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(KernelError::Config(format!("{name} must be positive")));
        }
        if self.vocab > u32::MAX as usize {
            return Err(KernelError::Config(
                "vocab must fit token ids in u32".into(),
            ));
        }
        if self.d_model % self.n_heads != 0 {
            return Err(KernelError::Config(format!(
                "n_heads ({}) must divide d_model ({})",
                self.n_heads, self.d_model
            )));
        }
        if self.n_heads % tp != 0 || self.d_ff % tp != 0 {
            return Err(KernelError::Config(format!(
                "tensor-parallel size {tp} must divide n_heads ({}) and d_ff ({})",
                self.n_heads, self.d_ff
            )));
        }
        if let Positions::Rotary { theta } = self.positions {
            check_config(self.head_dim(), theta)?;
        }
        if let Some(spec) = &self.moe {
            spec.validate(tp)?;
        }
        self.heads().check(tp)
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Width of the fused QKV projection's output: queries, keys, values.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.kv_heads) * self.head_dim()
    }

    /// Parameters of the whole, unsharded model.
    pub fn num_params(&self) -> usize {
        let (d, f, v) = (self.d_model, self.d_ff, self.vocab);
        let norm = match self.norm {
            NormKind::LayerNorm => 2 * d,
            NormKind::RmsNorm => d,
        };
        let (q, up) = (self.qkv_width(), self.mlp.fc1_width() * f);
        let bias = |on: bool, n: usize| if on { n } else { 0 };
        let (b_qkv, b) = (self.bias.qkv(), self.bias.rest());
        let attn = (d * q + bias(b_qkv, q)) + (d * d + bias(b, d));
        let mlp = (d * up + bias(b, up)) + (f * d + bias(b, d));
        let block = 2 * norm + attn + mlp;
        // A mixture's block has the mixture in place of the MLP.
        let (moe_layers, moe) = self.moe.map_or((0, 0), |s| {
            let layers = (0..self.n_layers).filter(|&l| s.is_moe_layer(l)).count();
            (layers, layers * s.layer_params(d, self.mlp, b))
        });
        let positions = match self.positions {
            Positions::Learned => self.seq_len * d,
            Positions::Rotary { .. } => 0,
        };
        v * d + positions + self.n_layers * block - moe_layers * mlp
            + moe
            + norm
            + d * v
            + bias(b, v)
    }
}

/// Cuts `layers` blocks into `stages` contiguous ranges as evenly as
/// possible (earlier stages take the remainder). Errors if `stages` is 0 or
/// exceeds `layers`: every stage holds at least one block.
pub fn partition(layers: usize, stages: usize) -> Result<Vec<Range<usize>>> {
    if stages == 0 || stages > layers {
        return Err(KernelError::Config(format!(
            "cannot cut {layers} layers into {stages} stages (need 1 <= stages <= layers)"
        )));
    }
    let (base, extra) = (layers / stages, layers % stages);
    let mut start = 0;
    Ok((0..stages)
        .map(|s| {
            let len = base + usize::from(s < extra);
            start += len;
            start - len..start
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_are_rejected() {
        let ok = GptConfig::new(16, 8, 16, 4, 2);
        ok.validate(4).unwrap();
        assert!(GptConfig { n_heads: 3, ..ok }.validate(1).is_err());
        assert!(ok.validate(3).is_err());
        assert!(GptConfig { vocab: 0, ..ok }.validate(1).is_err());
        assert!(ok.validate(0).is_err());
        let gqa = GptConfig { kv_heads: 2, ..ok };
        gqa.validate(2).unwrap();
        let err = gqa.validate(4).unwrap_err().to_string();
        assert!(
            err.contains("key/value heads (2) must be divisible by the tensor-parallel size 4"),
            "{err}"
        );
        assert!(GptConfig { kv_heads: 3, ..ok }.validate(1).is_err());
        assert!(GptConfig { kv_heads: 0, ..ok }.validate(1).is_err());
        let rotary = GptConfig {
            positions: Positions::ROTARY,
            ..ok
        };
        rotary.validate(2).unwrap();
        let odd = GptConfig {
            d_model: 12,
            ..rotary
        }
        .validate(1)
        .unwrap_err();
        assert!(
            odd.to_string().contains("head width 3 is not even"),
            "{odd}"
        );
        let theta = |theta| GptConfig {
            positions: Positions::Rotary { theta },
            ..ok
        };
        assert!(theta(-1.0).validate(1).is_err());
        assert!(theta(f64::INFINITY).validate(1).is_err());
    }

    #[test]
    fn partition_is_even_and_complete() {
        assert_eq!(partition(5, 2).unwrap(), vec![0..3, 3..5]);
        assert_eq!(partition(4, 4).unwrap(), vec![0..1, 1..2, 2..3, 3..4]);
        assert!(partition(2, 3).is_err());
        assert!(partition(2, 0).is_err());
    }
}
