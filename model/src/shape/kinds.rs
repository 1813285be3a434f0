//! The kinds a shape is made of, each with its text name (the CLI's flag values, JSON's
//! strings) and what it contributes to parameters and work.

use serde::{Deserialize, Serialize};

use pipewright_kinds::named;

/// The MLP of a block and the norm kind: defined once in `pipewright-kinds`, shared with the
/// kernels.
pub use pipewright_kinds::{BiasKind, MlpKind, NormKind};

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
