//! The kinds of a block's MLP and norms, with their text names (the CLI's flag values, JSON's
//! strings) and what they contribute to parameters and work.

use serde::{Deserialize, Serialize};

/// Text names of a kind: one per variant, parsed and printed the same way (`pipewright-model`'s
/// other shape kinds use it too).
#[macro_export]
macro_rules! named {
    ($t:ident, $what:literal, $($v:ident => $name:literal),+ $(,)?) => {
        impl $t {
            /// The names the kind is written as.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The kind's name.
            pub fn name(self) -> &'static str {
                match self {
                    $($t::$v => $name),+
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($t::$v),)+
                    _ => Err(format!(
                        "`{s}` is not {}: expected {}",
                        $what,
                        Self::NAMES.join(", ")
                    )),
                }
            }
        }
    };
}

/// The MLP of a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// `W2 gelu(W1 x)`: two matrices (GPT-2, GPT-3, GPT-NeoX).
    #[default]
    Gelu,
    /// `W2 (silu(W1 x) * W3 x)`: three matrices of width `ffn` (Shazeer 2020, "GLU Variants
    /// Improve Transformer"; Llama, Mistral, Qwen2).
    SwiGlu,
    /// `W2 (gelu(W1 x) * W3 x)`: as SwiGLU with GeLU as the gate (Shazeer 2020; Gemma).
    GeGlu,
}

named!(MlpKind, "an MLP kind", Gelu => "gelu", SwiGlu => "swiglu", GeGlu => "geglu");

impl MlpKind {
    /// Whether the MLP is gated (three matrices).
    pub fn gated(self) -> bool {
        self != MlpKind::Gelu
    }

    /// Matrices of the up projection (`d -> ffn` each): 1, or 2 for a gated MLP's gate and
    /// up matrices (computed as one fused column-parallel matmul, as Megatron-LM does).
    pub fn up_matrices(self) -> u64 {
        if self.gated() {
            2
        } else {
            1
        }
    }

    /// `ffn`-wide tensors the activation reads and writes, which are also the ones a block
    /// keeps for its backward: GeLU's input and output (2); a gated MLP's gate, up and their
    /// product (3; the backward needs the gate for the activation's derivative, the up
    /// projection for the product's, and the product for the down projection's weights).
    pub fn hidden_tensors(self) -> u64 {
        if self.gated() {
            3
        } else {
            2
        }
    }

    /// The MLP width a model of width `d` has unless told otherwise: `4d` for GeLU; for a
    /// gated MLP two thirds of that (the same parameters in three matrices), rounded up to a
    /// multiple of 256, as Llama's reference code does (`FeedForward` with `multiple_of =
    /// 256`: 11008 at d 4096).
    ///
    /// Saturating: a width past `u64` is a shape `pipewright_model::shape::ModelShape::check` refuses by its
    /// counts, so the default need only not wrap into a small one first.
    pub fn default_ffn(self, d: u64) -> u64 {
        if self.gated() {
            let two_thirds = d.saturating_mul(8) / 3;
            two_thirds.div_ceil(256).saturating_mul(256)
        } else {
            d.saturating_mul(4)
        }
    }
}

/// The norm before attention, before the MLP and before the LM head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// LayerNorm (Ba et al. 2016): a gain and a bias per feature.
    #[default]
    LayerNorm,
    /// RMSNorm (Zhang and Sennrich 2019): a gain only, no mean, no bias.
    RmsNorm,
}

named!(NormKind, "a norm kind", LayerNorm => "layernorm", RmsNorm => "rmsnorm");

impl NormKind {
    /// Vectors of `d` parameters one norm holds.
    pub fn vectors(self) -> u64 {
        match self {
            NormKind::LayerNorm => 2,
            NormKind::RmsNorm => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_print_and_serialize_by_one_name() {
        for (k, name) in [
            (MlpKind::Gelu, "gelu"),
            (MlpKind::SwiGlu, "swiglu"),
            (MlpKind::GeGlu, "geglu"),
        ] {
            assert_eq!(name.parse::<MlpKind>(), Ok(k));
            assert_eq!(k.to_string(), name);
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{name}\""));
        }
        for (k, name) in [
            (NormKind::LayerNorm, "layernorm"),
            (NormKind::RmsNorm, "rmsnorm"),
        ] {
            assert_eq!(name.parse::<NormKind>(), Ok(k));
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{name}\""));
        }
        assert_eq!(
            "relu".parse::<MlpKind>().unwrap_err(),
            "`relu` is not an MLP kind: expected gelu, swiglu, geglu"
        );
    }
}

/// Which linear layers carry biases (norms carry theirs by [`NormKind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BiasKind {
    /// Every linear layer: QKV, attention's output, the MLP's, and the LM head where it is
    /// untied (GPT-2, GPT-NeoX, pipewright's reference GPT).
    #[default]
    All,
    /// Only the QKV projection (Qwen2).
    Qkv,
    /// None (Llama, Mistral).
    None,
}

named!(BiasKind, "a bias kind", All => "all", Qkv => "qkv", None => "none");

impl BiasKind {
    /// Whether the QKV projection has a bias.
    pub fn qkv(self) -> bool {
        self != BiasKind::None
    }

    /// Whether every other linear layer (attention's output, the MLP's, the head) has one.
    pub fn rest(self) -> bool {
        self == BiasKind::All
    }
}
