//! The one description of a decoder-only transformer's shape, read by the memory model, the
//! plan's time model and (through the CLI) the reference model: query and key/value heads,
//! the MLP's kind and width, the norm, tied or untied embeddings, positions, biases, the
//! vocabulary and the sequence. What each kind costs (parameters, matmuls, FLOPs, the
//! collectives of tensor parallelism) is derived here once; [`crate::memory`] derives the
//! bytes a layer keeps from the same pieces, and [`pipewright_plan::work`] times them.
//!
//! The run's attention kind ([`AttentionKind`]: fused or materialized) is not part of the
//! shape: the same model runs either way, and the memory model
//! ([`crate::memory::MemoryConfig::attention`]) and the plan
//! ([`pipewright_plan::PlanRequest::attention`]) both read it from the run.
//!
//! [`hf`] reads a Hugging Face `config.json` into a shape; [`request`] reads a shape as a
//! user asks for it (the CLI's flags, Python's keywords of the same names, or a config),
//! with errors in the flags' words for both faces.

use serde::{Deserialize, Serialize};

pub mod hf;
mod kinds;
mod layers;
mod moe;
pub mod request;
mod request_moe;

pub use kinds::{AttentionKind, BiasKind, MlpKind, NormKind, PositionKind, RopeTheta};
pub use moe::{GroupsError, MlaShape, MoeShape, RouteGroups};
pub use request::{
    HfNote, HfNoteSays, MoeKinds, Named, ResolvedShape, ShapeKinds, ShapeRequest, ShapeRequestError,
};

/// A decoder-only transformer's shape (the memory model's and plan's unit of "a model").
///
/// Build one with [`ModelShape::gpt`] (GPT-2's kinds, pipewright's reference GPT) and change
/// the kinds with struct update syntax:
///
/// ```
/// use pipewright_model::shape::{MlpKind, ModelShape, NormKind, PositionKind, BiasKind};
///
/// // Llama 3 8B.
/// let llama = ModelShape {
///     kv_heads: 8,
///     mlp: MlpKind::SwiGlu,
///     norm: NormKind::RmsNorm,
///     positions: PositionKind::Rotary,
///     bias: BiasKind::None,
///     ..ModelShape::gpt(32, 4096, 32, 14336, 8192, 128256)
/// };
/// assert_eq!(llama.parameters(), 8_030_261_248);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "RawShape")]
pub struct ModelShape {
    /// Transformer blocks.
    pub layers: u32,
    /// Width of the residual stream (`h` in the papers).
    pub d_model: u64,
    /// Query heads (`a`).
    pub heads: u32,
    /// Key/value heads: `heads` for multi-head attention, fewer for grouped-query attention
    /// (Ainslie et al. 2023), 1 for multi-query attention (Shazeer 2019). Must divide `heads`.
    pub kv_heads: u32,
    /// MLP hidden width (`4 * d_model` in GPT-2; each of a gated MLP's three matrices has it).
    pub ffn: u64,
    /// Tokens per sequence (`s`).
    pub seq_len: u64,
    /// Vocabulary size (`V`).
    pub vocab: u64,
    /// The MLP's kind.
    pub mlp: MlpKind,
    /// The norm's kind.
    pub norm: NormKind,
    /// The LM head reuses the token embedding's matrix (GPT-2) instead of its own (Llama).
    pub tied_embeddings: bool,
    /// How positions enter: a learned table of `seq_len` rows, or rotary (no parameters).
    pub positions: PositionKind,
    /// The base of rotary positions' angles (read where `positions` is rotary; the
    /// reference model's alone: it changes no count).
    pub rope_theta: RopeTheta,
    /// Which linear layers carry biases.
    pub bias: BiasKind,
    /// Width of one attention head where it is not `d_model / heads` (Qwen3-235B-A22B:
    /// 128 at `d_model` 4096 with 64 heads); `None`: `d_model / heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_width: Option<u64>,
    /// An RMSNorm of each query and key head before attention (Qwen3): `2 x head_dim`
    /// parameters a layer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// Multi-head latent attention in place of the Q, K and V projections (DeepSeek-V2/V3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaShape>,
    /// A mixture of experts in place of the MLP of some layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeShape>,
}

/// [`ModelShape`] as written in JSON: fields added since the first version may be absent
/// (their defaults are GPT-2's, and `kv_heads` defaults to `heads`).
#[derive(Deserialize)]
struct RawShape {
    layers: u32,
    d_model: u64,
    heads: u32,
    #[serde(default)]
    kv_heads: Option<u32>,
    ffn: u64,
    seq_len: u64,
    vocab: u64,
    #[serde(default)]
    mlp: MlpKind,
    #[serde(default)]
    norm: NormKind,
    #[serde(default)]
    tied_embeddings: bool,
    #[serde(default)]
    positions: PositionKind,
    #[serde(default)]
    rope_theta: RopeTheta,
    #[serde(default)]
    bias: BiasKind,
    #[serde(default)]
    head_width: Option<u64>,
    #[serde(default)]
    qk_norm: bool,
    #[serde(default)]
    mla: Option<MlaShape>,
    #[serde(default)]
    moe: Option<MoeShape>,
}

impl From<RawShape> for ModelShape {
    fn from(r: RawShape) -> Self {
        ModelShape {
            layers: r.layers,
            d_model: r.d_model,
            heads: r.heads,
            kv_heads: r.kv_heads.unwrap_or(r.heads),
            ffn: r.ffn,
            seq_len: r.seq_len,
            vocab: r.vocab,
            mlp: r.mlp,
            norm: r.norm,
            tied_embeddings: r.tied_embeddings,
            positions: r.positions,
            rope_theta: r.rope_theta,
            bias: r.bias,
            head_width: r.head_width,
            qk_norm: r.qk_norm,
            mla: r.mla,
            moe: r.moe,
        }
    }
}

/// How tensor parallelism splits a linear layer (Megatron-LM, Shoeybi et al. 2019).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpSplit {
    /// By output columns: each rank computes `outputs / t` of them (bias split likewise).
    Column,
    /// By input rows: each rank computes a partial sum of all outputs, all-reduced after
    /// (bias whole, added once).
    Row,
}

/// One linear layer of a block: `inputs -> outputs`, split over TP as `split` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Input features.
    pub inputs: u64,
    /// Output features.
    pub outputs: u64,
    /// The TP split.
    pub split: TpSplit,
    /// Whether it has a bias.
    pub bias: bool,
}

impl Linear {
    /// Weights and bias of one of `t` TP ranks.
    pub fn rank_parameters(&self, t: u64) -> u64 {
        let bias = if self.bias { self.outputs } else { 0 };
        match self.split {
            TpSplit::Column => (self.inputs * self.outputs + bias) / t,
            TpSplit::Row => self.inputs * self.outputs / t + bias,
        }
    }
}

impl ModelShape {
    /// A GPT-2-style shape (pipewright's reference GPT): multi-head attention, a GeLU MLP,
    /// LayerNorm, untied embeddings, a learned position table, biases everywhere.
    pub fn gpt(layers: u32, d_model: u64, heads: u32, ffn: u64, seq_len: u64, vocab: u64) -> Self {
        ModelShape {
            layers,
            d_model,
            heads,
            kv_heads: heads,
            ffn,
            seq_len,
            vocab,
            mlp: MlpKind::Gelu,
            norm: NormKind::LayerNorm,
            tied_embeddings: false,
            positions: PositionKind::Learned,
            rope_theta: RopeTheta::DEFAULT,
            bias: BiasKind::All,
            head_width: None,
            qk_norm: false,
            mla: None,
            moe: None,
        }
    }

    /// Width of one head: `head_width` where given, else `d_model / heads`.
    pub fn head_dim(&self) -> u64 {
        self.head_width
            .unwrap_or(self.d_model / u64::from(self.heads.max(1)))
    }

    /// Width of the queries (and of attention's output), `heads * head_dim`: `d_model`
    /// unless the heads have their own width.
    pub fn q_width(&self) -> u64 {
        u64::from(self.heads) * self.head_dim()
    }

    /// Width of the keys (and of the values): `kv_heads * head_dim`, `d_model` without GQA.
    pub fn kv_width(&self) -> u64 {
        u64::from(self.kv_heads) * self.head_dim()
    }

    /// A dense block's four linear layers (see [`ModelShape::is_uniform`] for the shapes
    /// whose every block is one), in order: the fused QKV projection (`d -> q + 2 kv`,
    /// column-parallel), attention's output projection (row-parallel), the MLP's up
    /// projection (`d -> f`, or `d -> 2f` for a gated MLP's gate and up matrices fused, as
    /// Megatron-LM fuses them; column-parallel) and its down projection (`f -> d`,
    /// row-parallel). Parameters, FLOPs and the time model all read this one list.
    pub fn block_linears(&self) -> [Linear; 4] {
        let (d, f) = (self.d_model, self.ffn);
        let all = self.bias == BiasKind::All;
        [
            Linear {
                inputs: d,
                outputs: self.q_width() + 2 * self.kv_width(),
                split: TpSplit::Column,
                bias: all || self.bias == BiasKind::Qkv,
            },
            Linear {
                inputs: self.q_width(),
                outputs: d,
                split: TpSplit::Row,
                bias: all,
            },
            Linear {
                inputs: d,
                outputs: f * self.mlp.up_matrices(),
                split: TpSplit::Column,
                bias: all,
            },
            Linear {
                inputs: f,
                outputs: d,
                split: TpSplit::Row,
                bias: all,
            },
        ]
    }

    /// Parameters of one norm (replicated on every TP rank).
    pub fn norm_parameters(&self) -> u64 {
        self.norm.vectors() * self.d_model
    }

    /// Parameters of one block on one of `t` TP ranks (`t = 1`: the whole block).
    pub fn block_parameters(&self, t: u64) -> u64 {
        let t = t.max(1);
        let linears: u64 = self
            .block_linears()
            .iter()
            .map(|l| l.rank_parameters(t))
            .sum();
        linears + 2 * self.norm_parameters() + self.qk_norm_parameters()
    }

    /// Parameters of the query and key heads' norms of one layer (none without `qk_norm`).
    pub fn qk_norm_parameters(&self) -> u64 {
        if self.qk_norm {
            2 * self.head_dim()
        } else {
            0
        }
    }

    /// The token embedding, `V x d`.
    pub fn embedding_parameters(&self) -> u64 {
        self.vocab * self.d_model
    }

    /// The learned position table (`seq_len x d`), or nothing for rotary positions.
    pub fn position_parameters(&self) -> u64 {
        match self.positions {
            PositionKind::Learned => self.seq_len * self.d_model,
            PositionKind::Rotary => 0,
        }
    }

    /// The LM head's own parameters (`d x V`, with a bias under [`BiasKind::All`]), where
    /// it has its own: untied, or tied but on another pipeline stage than the embedding
    /// (Megatron-LM keeps a copy of the embedding on the last stage and all-reduces the two
    /// copies' gradients), `elsewhere`.
    pub fn head_parameters(&self, elsewhere: bool) -> u64 {
        match (self.tied_embeddings, elsewhere) {
            (true, false) => 0,
            (true, true) => self.embedding_parameters(),
            (false, _) => {
                let bias = if self.bias == BiasKind::All {
                    self.vocab
                } else {
                    0
                };
                self.d_model * self.vocab + bias
            }
        }
    }

    /// Parameters of the model, each counted once (a tied embedding once), every expert
    /// of a mixture counted.
    pub fn parameters(&self) -> u64 {
        self.embedding_parameters()
            + self.position_parameters()
            + self.layers_parameters(false)
            + self.norm_parameters()
            + self.head_parameters(false)
    }

    /// Parameters one token's forward uses: [`ModelShape::parameters`] with only the
    /// `top_k` routed experts of each MoE layer (and the shared ones); the embedding and the
    /// LM head counted whole, as Mixtral's and DeepSeek's published "active" counts do.
    pub fn active_parameters(&self) -> u64 {
        self.embedding_parameters()
            + self.position_parameters()
            + self.layers_parameters(true)
            + self.norm_parameters()
            + self.head_parameters(false)
    }

    /// Forward FLOPs of one block for `b` sequences, whole (before the TP split): `2` per
    /// multiply-add of every linear layer (`2 b s` times the sum of their weights), plus the
    /// attention core's two batched matmuls, scores `Q K^T` and context `P V`, `2 b s^2 q`
    /// each (`q` the queries' width, `h` unless heads have their own width; every query head
    /// attends, so GQA's shared keys change neither). Of a dense block: the FLOPs of the
    /// layers of a mixture or of latent attention are [`ModelShape::layer_flops`]. At `ffn = 4h`
    /// with multi-head attention this is Narayanan et al. (SC'21) eq. 3's
    /// `24 b s h^2 (1 + s/6h)`. Causal masking is not subtracted (Megatron-LM and the
    /// published MFU figures count the full square).
    pub fn block_flops(&self, b: f64) -> f64 {
        let s = self.seq_len as f64;
        let weights: f64 = self
            .block_linears()
            .iter()
            .map(|l| (l.inputs * l.outputs) as f64)
            .sum();
        2.0 * b * s * weights + 4.0 * b * s * s * self.q_width() as f64
    }

    /// Forward FLOPs of the LM head for `b` sequences, whole: `2 b s h V`.
    pub fn head_flops(&self, b: f64) -> f64 {
        2.0 * b * self.seq_len as f64 * self.d_model as f64 * self.vocab as f64
    }

    /// Model FLOPs of one training step of `sequences` sequences: forward and backward (3x
    /// the forward), no recomputation, as MFU counts them.
    pub fn model_flops(&self, sequences: f64) -> f64 {
        3.0 * (self.layers_flops(sequences) + self.head_flops(sequences))
    }

    /// Elements of one tensor-parallel collective of a block for `b` sequences: each of the
    /// two row-parallel layers (attention's output projection, the MLP's down projection)
    /// ends in an all-reduce of its `b s h` output in the forward, and each column-parallel
    /// layer's input gradient in one in the backward (with sequence parallelism a
    /// reduce-scatter and an all-gather, the same ring volume). GQA's narrower keys and values
    /// live inside the TP region, so they change no collective: they shrink the QKV matmul,
    /// its parameters and gradients (and so the data-parallel reduction) and its stash.
    ///
    /// As `f64`: `b` is any microbatch size a plan may try, and the product feeds only times.
    pub fn tp_collective_elements(&self, b: u64) -> f64 {
        b as f64 * self.seq_len as f64 * self.d_model as f64
    }

    /// TP collectives per block in the forward (and again in the input-gradient backward).
    pub const TP_COLLECTIVES_PER_BLOCK: u32 = 2;

    /// Checks the sizes against each other, naming the first that does not fit.
    pub fn check(&self) -> Result<(), ShapeError> {
        let positive = [
            ("layers", u64::from(self.layers)),
            ("d_model", self.d_model),
            ("heads", u64::from(self.heads)),
            ("kv_heads", u64::from(self.kv_heads)),
            ("ffn", self.ffn),
            ("seq_len", self.seq_len),
            ("vocab", self.vocab),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, x)| *x == 0) {
            return Err(ShapeError::NotPositive(name));
        }
        // Heads of their own width (or latent attention's) need not divide the width.
        let own_width = self.head_width.is_some() || self.mla.is_some();
        let divides = [
            ("heads", "d_model", u64::from(self.heads), self.d_model),
            (
                "kv_heads",
                "heads",
                u64::from(self.kv_heads),
                u64::from(self.heads),
            ),
        ];
        for (a, b, x, y) in divides.into_iter().skip(usize::from(own_width)) {
            if y % x != 0 {
                return Err(ShapeError::NotDividing { a, x, b, y });
            }
        }
        self.check_parts()?;
        if self.mla.is_none() && self.positions == PositionKind::Rotary && self.head_dim() % 2 != 0
        {
            return Err(ShapeError::OddRotaryHead(self.head_dim()));
        }
        self.check_counts()?;
        self.check_part_counts()
    }

    /// Every count the shape's methods multiply out (parameters, a sequence's activations)
    /// stays within [`MAX_COUNT`], so they are exact in a `u64` (and their 16 bytes a
    /// parameter of weights, gradients and AdamW state too); worked out in `u128`, where
    /// none of these products of `u64` fields can wrap unseen (a wrap is `None`, refused).
    fn check_counts(&self) -> Result<(), ShapeError> {
        let w = |x: u64| u128::from(x);
        let (d, f) = (w(self.d_model), w(self.ffn));
        let kv = w(self.kv_width());
        let up = w(self.mlp.up_matrices());
        // Biases and norms add at most a few widths a layer: 8 (d + f) bounds them.
        let block = d
            .checked_mul(d + 2 * kv)
            .and_then(|qkv| qkv.checked_add(d.checked_mul(d)?))
            .and_then(|a| a.checked_add(d.checked_mul(f)?.checked_mul(up + 1)?))
            .and_then(|a| a.checked_add(8 * (d + f)));
        let terms: [(&'static str, Option<u128>); 4] = [
            (
                "vocab x d_model (embedding and LM head)",
                d.checked_mul(2 * w(self.vocab)),
            ),
            (
                "seq_len x d_model (a sequence's activations, learned positions)",
                d.checked_mul(w(self.seq_len)),
            ),
            (
                "layers x d_model x ffn (the blocks)",
                block.and_then(|b| b.checked_mul(w(u64::from(self.layers)))),
            ),
            ("d_model x d_model (a block's attention)", d.checked_mul(d)),
        ];
        let limit = u128::from(MAX_COUNT);
        for (what, n) in terms {
            if n.map_or(true, |n| n > limit) {
                return Err(ShapeError::TooLarge {
                    what,
                    layers: self.layers,
                    d_model: self.d_model,
                    ffn: self.ffn,
                    seq_len: self.seq_len,
                    vocab: self.vocab,
                });
            }
        }
        let total = terms.iter().filter_map(|t| t.1).sum::<u128>();
        if total > limit {
            return Err(ShapeError::TooLarge {
                what: "the parameters together",
                layers: self.layers,
                d_model: self.d_model,
                ffn: self.ffn,
                seq_len: self.seq_len,
                vocab: self.vocab,
            });
        }
        Ok(())
    }
}

/// The largest count of a shape (parameters, a sequence's activations): 2^60, about 1.2e18,
/// a million times any model trained so far, and small enough that 16 bytes of each stay
/// within a `u64`.
pub const MAX_COUNT: u64 = 1 << 60;

/// Why a shape is not a model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A size that must be at least 1.
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    /// Fields of a mixture of experts or of latent attention that contradict each other.
    #[error("{0}")]
    Conflict(String),
    /// Sizes whose products pass [`MAX_COUNT`] (they would wrap a `u64` count).
    #[error("{what} pass 2^60 (sizes: layers {layers}, d_model {d_model}, ffn {ffn}, seq_len {seq_len}, vocab {vocab}): check the sizes")]
    TooLarge {
        /// The product that is too large, with the fields it multiplies.
        what: &'static str,
        /// Blocks.
        layers: u32,
        /// Width.
        d_model: u64,
        /// MLP width.
        ffn: u64,
        /// Sequence.
        seq_len: u64,
        /// Vocabulary.
        vocab: u64,
    },
    /// Rotary positions turn pairs of a head's dimensions: its width must be even.
    #[error("rotary positions turn pairs of a head's dimensions: the head width {0} (d_model / heads) is not even")]
    OddRotaryHead(u64),
    /// A size that must divide another.
    #[error("{a} ({x}) must divide {b} ({y})")]
    NotDividing {
        /// The divisor's name.
        a: &'static str,
        /// The divisor.
        x: u64,
        /// The dividend's name.
        b: &'static str,
        /// The dividend.
        y: u64,
    },
}

#[cfg(test)]
mod tests;
