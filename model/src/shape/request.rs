//! A shape as a user asks for it: sizes and kinds by field (`kv_heads`, the CLI's `--kv-heads`
//! and Python's `kv_heads=`), or a Hugging Face `config.json`'s text. Both faces, the CLI and
//! the Python package, fill a [`ShapeRequest`] and call [`ShapeRequest::resolve`], so a shape
//! is read, and refused, in one set of words: each error names the fields, and each face
//! writes them its way ([`ShapeRequestError::named`]: `--kv-heads 3 must divide --heads 4`,
//! `kv_heads=3 must divide heads=4`).
//!
//! Nothing here reads a file: a face hands over a config's text with the name to call it by.

use super::hf::{from_hf_config, HfError, HfModel};
pub use super::request_moe::{flag_form, FieldName, MoeError, MoeKinds};
use super::{BiasKind, MlpKind, ModelShape, NormKind, PositionKind, RopeTheta, ShapeError};

/// The kinds of a shape beyond its sizes, as given (`None`: the reference GPT's, GPT-2's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShapeKinds {
    /// MLP hidden width (default [`MlpKind::default_ffn`] of the MLP's kind).
    pub ffn: Option<u64>,
    /// Key/value heads (default: the query heads).
    pub kv_heads: Option<u32>,
    /// The MLP.
    pub mlp: Option<MlpKind>,
    /// The norm.
    pub norm: Option<NormKind>,
    /// The LM head reuses the token embedding.
    pub tied_embeddings: bool,
    /// Positions.
    pub positions: Option<PositionKind>,
    /// The base of rotary positions' angles (only with rotary positions).
    pub rope_theta: Option<RopeTheta>,
    /// Biases of the linear layers.
    pub bias: Option<BiasKind>,
    /// A mixture of experts (none given: a dense model).
    pub moe: MoeKinds,
}

impl ShapeKinds {
    /// The kinds given, by field (`kv_heads`).
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("ffn", self.ffn.is_some()),
            ("kv_heads", self.kv_heads.is_some()),
            ("mlp", self.mlp.is_some()),
            ("norm", self.norm.is_some()),
            ("tied_embeddings", self.tied_embeddings),
            ("positions", self.positions.is_some()),
            ("rope_theta", self.rope_theta.is_some()),
            ("bias", self.bias.is_some()),
        ]
        .into_iter()
        .filter(|f| f.1)
        .map(|f| f.0)
        .chain(self.moe.given())
        .collect()
    }

    /// The shape of these sizes with these kinds, checked.
    pub fn shape(
        &self,
        layers: u32,
        d_model: u64,
        heads: u32,
        seq_len: u64,
        vocab: u64,
    ) -> Result<ModelShape, ShapeRequestError> {
        let mlp = self.mlp.unwrap_or_default();
        let positions = self.positions.unwrap_or_default();
        if self.rope_theta.is_some() && positions != PositionKind::Rotary {
            return Err(ShapeRequestError::RopeWithoutRotary);
        }
        let ffn = self.ffn.unwrap_or_else(|| mlp.default_ffn(d_model));
        let moe = self.moe.moe(layers, ffn).map_err(ShapeRequestError::Moe)?;
        let shape = ModelShape {
            layers,
            d_model,
            heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            ffn,
            seq_len,
            vocab,
            mlp,
            norm: self.norm.unwrap_or_default(),
            tied_embeddings: self.tied_embeddings,
            positions,
            rope_theta: self.rope_theta.unwrap_or_default(),
            bias: self.bias.unwrap_or_default(),
            head_width: None,
            qk_norm: false,
            mla: None,
            moe,
        };
        shape.check().map_err(ShapeRequestError::Shape)?;
        Ok(shape)
    }
}

/// Text handed over by a face with the name its errors call it by (a file's path, or
/// Python's `<text>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// What the errors call it.
    pub name: String,
    /// Its content.
    pub text: String,
}

/// A GPT's shape as asked for: sizes and kinds, or a Hugging Face config (whose sequence
/// length `seq_len` replaces where given). Nothing checked yet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShapeRequest {
    /// Transformer blocks (`--layers`).
    pub layers: Option<u32>,
    /// Width of the residual stream (`--d-model`).
    pub d_model: Option<u64>,
    /// Attention heads (`--heads`).
    pub heads: Option<u32>,
    /// Tokens per sequence (`--seq-len`).
    pub seq_len: Option<u64>,
    /// Vocabulary size (`--vocab`).
    pub vocab: Option<u64>,
    /// The kinds beyond the sizes.
    pub kinds: ShapeKinds,
    /// A Hugging Face config.json instead of the sizes and kinds (`--hf-config`).
    pub hf_config: Option<Named>,
}

/// A shape, with what the user should know of how it was read (a config's notes).
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedShape {
    /// The shape.
    pub shape: ModelShape,
    /// One each, written `note: --hf-config NAME: ...` by the CLI; empty for a shape given
    /// by sizes.
    pub notes: Vec<HfNote>,
}

/// What a note on a config says, in words that name no field of a face.
#[derive(Clone, Debug, PartialEq)]
pub enum HfNoteSays {
    /// The sequence length came from the config's `field` (none was given to replace it).
    SeqLen {
        /// The length.
        seq_len: u64,
        /// The config's field it came from (`max_position_embeddings`).
        field: &'static str,
    },
    /// Something the config has that is not modelled, in the config's own field names.
    NotModelled(String),
}

/// A note on how a config named `name` was read; each face writes the fields it names its
/// way ([`HfNote::named`]). `Display` is the command line's.
#[derive(Clone, Debug, PartialEq)]
pub struct HfNote {
    /// The config's name (a path, or Python's `config`).
    pub name: String,
    /// What it says.
    pub says: HfNoteSays,
}

impl HfNote {
    /// The line with each field written as `name` writes it: the CLI's
    /// `note: --hf-config PATH: ... (--seq-len plans another)`, Python's `hf_config=PATH`.
    pub fn named(&self, name: FieldName<'_>) -> String {
        let config = name("hf_config", Some(self.name.clone()));
        match &self.says {
            HfNoteSays::SeqLen { seq_len, field } => format!(
                "note: {config}: sequence {seq_len} from its {field} ({} plans another)",
                name("seq_len", None)
            ),
            HfNoteSays::NotModelled(note) => format!("note: {config}: {note}"),
        }
    }
}

impl std::fmt::Display for HfNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.named(&flag_form))
    }
}

impl ShapeRequest {
    /// The sizes given, by field (`hf_config` aside).
    pub fn sizes(&self) -> [(&'static str, Option<u64>); 5] {
        [
            ("layers", self.layers.map(u64::from)),
            ("d_model", self.d_model),
            ("heads", self.heads.map(u64::from)),
            ("seq_len", self.seq_len),
            ("vocab", self.vocab),
        ]
    }

    /// Whether anything of a shape was given.
    pub fn is_empty(&self) -> bool {
        self.hf_config.is_none()
            && self.sizes().iter().all(|s| s.1.is_none())
            && self.kinds.given().is_empty()
    }

    /// The first field a Hugging Face config replaces that was given beside one (`seq_len`
    /// does not: it replaces the config's).
    fn beside_config(&self) -> Option<&'static str> {
        let sizes = self.sizes();
        sizes
            .iter()
            .filter(|s| s.0 != "seq_len" && s.1.is_some())
            .map(|s| s.0)
            .chain(self.kinds.given())
            .next()
    }

    /// The shape: read from the config, or built from the sizes (each required) and kinds.
    pub fn resolve(&self) -> Result<ResolvedShape, ShapeRequestError> {
        if let Some(hf) = &self.hf_config {
            if let Some(field) = self.beside_config() {
                return Err(ShapeRequestError::BesideConfig {
                    name: hf.name.clone(),
                    field,
                });
            }
            let model = read_hf_config(hf, self.seq_len)?;
            let notes = hf_notes(&hf.name, &model, self.seq_len.is_none());
            return Ok(ResolvedShape {
                shape: model.shape,
                notes,
            });
        }
        let mut sizes = [0u64; 5];
        for (size, (field, given)) in sizes.iter_mut().zip(self.sizes()) {
            *size = given.ok_or(ShapeRequestError::Required(field))?;
        }
        let [layers, d_model, heads, seq_len, vocab] = sizes;
        let count = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        let shape = self
            .kinds
            .shape(count(layers), d_model, count(heads), seq_len, vocab)?;
        Ok(ResolvedShape {
            shape,
            notes: Vec::new(),
        })
    }
}

/// A config.json as a shape, its sequence length replaced by `seq_len` where given.
fn read_hf_config(hf: &Named, seq_len: Option<u64>) -> Result<HfModel, ShapeRequestError> {
    let mut model = from_hf_config(&hf.text).map_err(|error| ShapeRequestError::Hf {
        name: hf.name.clone(),
        error,
    })?;
    if let Some(s) = seq_len {
        if s == 0 {
            return Err(ShapeRequestError::Shape(ShapeError::NotPositive("seq_len")));
        }
        model.shape.seq_len = s;
    }
    Ok(model)
}

/// What a user should know of how `model` was read from `name`: where its sequence length
/// came from (when the config's is kept, `config_seq_len`), and what the config has that is
/// not modelled.
fn hf_notes(name: &str, model: &HfModel, config_seq_len: bool) -> Vec<HfNote> {
    let note = |says| HfNote {
        name: name.to_string(),
        says,
    };
    let seq_len = config_seq_len.then(|| {
        note(HfNoteSays::SeqLen {
            seq_len: model.shape.seq_len,
            field: model.seq_len_field,
        })
    });
    seq_len
        .into_iter()
        .chain(
            model
                .notes
                .iter()
                .map(|n| note(HfNoteSays::NotModelled(n.clone()))),
        )
        .collect()
}

/// A shape's error with each field written as `name` writes it.
fn shape_error(e: &ShapeError, name: FieldName<'_>) -> String {
    let with = |f: &str, v: &dyn std::fmt::Display| name(f, Some(v.to_string()));
    match e {
        ShapeError::NotPositive(field) => format!("{} must be at least 1", name(field, None)),
        ShapeError::NotDividing { a, x, b, y } => {
            format!("{} must divide {}", with(a, x), with(b, y))
        }
        ShapeError::TooLarge {
            what,
            layers,
            d_model,
            ffn,
            seq_len,
            vocab,
        } => format!(
            "{what} pass 2^60 ({}, {}, {}, {}, {}): a count that large would wrap; check the sizes",
            with("layers", layers),
            with("d_model", d_model),
            with("ffn", ffn),
            with("seq_len", seq_len),
            with("vocab", vocab)
        ),
        ShapeError::Conflict(why) => why.clone(),
        ShapeError::OddRotaryHead(w) => format!(
            "{} turns pairs of a head's dimensions: the head width {w} ({} / {}) is not even",
            with("positions", &"rotary"),
            name("d_model", None),
            name("heads", None)
        ),
    }
}

/// Why a shape request is not a shape; each names the fields, which each face writes its
/// way ([`ShapeRequestError::named`]). `Display` is the command line's.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShapeRequestError {
    /// A size that was not given (its field).
    #[error("{}", self.named(&flag_form))]
    Required(&'static str),
    /// Sizes that do not fit each other.
    #[error("{}", self.named(&flag_form))]
    Shape(ShapeError),
    /// Mixture-of-experts fields that do not fit each other.
    #[error("{}", self.named(&flag_form))]
    Moe(MoeError),
    /// `rope_theta` without rotary positions.
    #[error("{}", self.named(&flag_form))]
    RopeWithoutRotary,
    /// A config.json (`hf_config`) that is not a shape.
    #[error("{}", self.named(&flag_form))]
    Hf {
        /// The config's name.
        name: String,
        /// Why.
        error: HfError,
    },
    /// A size or kind given beside a config, which gives them all.
    #[error("{}", self.named(&flag_form))]
    BesideConfig {
        /// The config's name.
        name: String,
        /// The field given beside it.
        field: &'static str,
    },
}

impl ShapeRequestError {
    /// The message with each field written as `name` writes it (the CLI's `--top-k 5`,
    /// Python's `top_k=5`).
    pub fn named(&self, name: FieldName<'_>) -> String {
        let with = |f: &str, v: &dyn std::fmt::Display| name(f, Some(v.to_string()));
        match self {
            ShapeRequestError::Required(field) => format!("{} is required", name(field, None)),
            ShapeRequestError::Shape(e) => shape_error(e, name),
            ShapeRequestError::Moe(e) => e.named(name),
            ShapeRequestError::RopeWithoutRotary => format!(
                "{} is the base of rotary positions: also give {}",
                name("rope_theta", None),
                with("positions", &"rotary")
            ),
            ShapeRequestError::Hf { name: n, error } => {
                format!("{}: {error}", with("hf_config", n))
            }
            ShapeRequestError::BesideConfig { name: n, field } => format!(
                "{} gives the model's shape: leave out {} ({} alone may replace its sequence length)",
                with("hf_config", n),
                name(field, None),
                name("seq_len", None)
            ),
        }
    }
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
    out += &moe_phrase(s);
    out += &format!(", vocab {}, seq {}", s.vocab, s.seq_len);
    out
}

/// What [`describe`] says of heads of their own width, latent attention and a mixture of
/// experts (nothing for a shape without them, so a dense shape's phrase is unchanged).
fn moe_phrase(s: &ModelShape) -> String {
    let mut out = String::new();
    if let Some(w) = s.head_width {
        out += &format!(", heads of {w}");
    }
    if s.qk_norm {
        out += ", qk-norm";
    }
    if let Some(m) = s.mla {
        out += &format!(
            ", latent attention (q {}, kv {})",
            m.q_lora_rank.map_or("direct".into(), |r| r.to_string()),
            m.kv_lora_rank
        );
    }
    if let Some(m) = s.moe {
        let groups = m.route_groups.map_or(String::new(), |g| {
            format!(", from {} of {} groups", g.per_token, g.groups)
        });
        out += &format!(
            ", {} experts of {} (top {}{groups})",
            m.experts, m.expert_ffn, m.top_k
        );
        if m.shared_experts > 0 {
            out += &format!(" + {} shared of {}", m.shared_experts, m.shared_ffn);
        }
        if m.dense_layers > 0 {
            out += &format!(" after {} dense", m.dense_layers);
        }
        if m.every > 1 {
            out += &format!(" every {} layers", m.every);
        }
    }
    out
}
