//! The kinds a shape is made of, each with its text name (the CLI's flag values, JSON's
//! strings) and what it contributes to parameters and work.

use serde::{Deserialize, Serialize};

/// Text names of a kind: one per variant, parsed and printed the same way.
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
    /// Saturating: a width past `u64` is a shape [`super::ModelShape::check`] refuses by its
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

/// How positions enter the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PositionKind {
    /// A learned table added to the token embedding, one row per position (GPT-2).
    #[default]
    Learned,
    /// Rotary embeddings applied to queries and keys (Su et al. 2021): no parameters, and
    /// element-wise work small beside the matmuls.
    Rotary,
}

named!(PositionKind, "a position kind", Learned => "learned", Rotary => "rotary");

/// The base of rotary embeddings' angles (Hugging Face's `rope_theta`): the pair `i` of a
/// head of width `d` at position `p` turns by `p * theta^(-2i/d)`. 10000 by default (Su et
/// al. 2021; Llama 2, Mistral 7B v0.1), 500000 in Llama 3, 1000000 in Qwen2. Read by the
/// reference model only: it changes no parameter, FLOP or byte.
///
/// A finite number above 0, so equality and hashing by its bits are those of its value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct RopeTheta(f64);

impl RopeTheta {
    /// Su et al.'s base, 10000.
    pub const DEFAULT: RopeTheta = RopeTheta(10_000.0);

    /// `theta`, or why it is not a base (not finite, or not above 0).
    pub fn new(theta: f64) -> Result<Self, String> {
        if theta.is_finite() && theta > 0.0 {
            Ok(RopeTheta(theta))
        } else {
            Err(format!(
                "rope_theta must be a finite number above 0, got {theta}"
            ))
        }
    }

    /// The base.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl Default for RopeTheta {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Eq for RopeTheta {}

impl std::hash::Hash for RopeTheta {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl TryFrom<f64> for RopeTheta {
    type Error = String;
    fn try_from(theta: f64) -> Result<Self, String> {
        Self::new(theta)
    }
}

impl From<RopeTheta> for f64 {
    fn from(t: RopeTheta) -> f64 {
        t.0
    }
}

/// Written as the shortest decimal that reads back to it (`500000`, `10000`).
impl std::fmt::Display for RopeTheta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for RopeTheta {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number"))?;
        Self::new(v)
    }
}

/// Which linear layers carry biases (norms carry theirs by [`NormKind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BiasKind {
    /// Every linear layer, the LM head included where it is untied (GPT-2, GPT-NeoX,
    /// pipewright's reference GPT).
    #[default]
    All,
    /// Only the QKV projection (Qwen2).
    Qkv,
    /// None (Llama, Mistral).
    None,
}

named!(BiasKind, "a bias kind", All => "all", Qkv => "qkv", None => "none");

/// How a run computes attention's core (`softmax(Q K^T / sqrt(d)) V`): a property of the
/// run, not of the model, read by both the time and the memory model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// The `s x s` scores are written to memory: mask, softmax and dropout read and write
    /// them, and the backward reads the kept probabilities (Megatron-LM of 2021; pipewright's
    /// CPU backend). Korthikanti et al. 2022 count `5as/h` bytes a token for them.
    #[default]
    Materialized,
    /// Tiled in on-chip memory, never written whole (FlashAttention: Dao et al. 2022, Dao
    /// 2023): the forward keeps its output and one logsumexp per row and query head, and the
    /// backward recomputes the probabilities from them.
    Fused,
}

named!(AttentionKind, "an attention kind", Materialized => "materialized", Fused => "fused");
