//! A Hugging Face `config.json` as a [`ModelShape`], so a user plans the model they have.
//!
//! Read: the mixtures of experts `mixtral`, `qwen2_moe`, `qwen3_moe` and `deepseek_v3` (see
//! `moe.rs`; `gpt_oss` refused, naming what it lacks); the Llama family (`model_type` `llama`, `mistral`, `qwen2`: RMSNorm, rotary
//! positions, a gated MLP whose gate is `hidden_act`, grouped-query attention by
//! `num_key_value_heads`), `gpt2` (`n_layer`, `n_embd`, `n_head`, `n_inner`, `n_positions`;
//! LayerNorm, a learned position table, tied embeddings unless `tie_word_embeddings` says
//! otherwise) and `gpt_neox` (LayerNorm, rotary, untied by default). Each family's defaults
//! are those of its `transformers` configuration class when a field is absent.
//!
//! Rotary positions' base is `rope_theta` (`rope_parameters.rope_theta` in the newer layout;
//! `rotary_emb_base` in GPT-NeoX's older configs), 10000 where absent. What the reference
//! model's rotary embeddings do not model is said in a note: a `rope_scaling` other than the
//! default (Llama 3.1's `llama3` frequencies), GPT-NeoX's partial rotation (`rotary_pct`
//! below 1) and its parallel residual (`use_parallel_residual`, true unless set false); none
//! changes a parameter, FLOP or byte of the plan.
//!
//! The sequence length is the context the model was pretrained at: `rope_scaling`'s (or, in
//! the newer layout, `rope_parameters`') `original_max_position_embeddings` where a context
//! extension names it (Llama 3.1: 8192), else `max_position_embeddings` (`n_positions` for
//! GPT-2). A caller may plan another.
//!
//! The text is parsed here (the crate does no IO); a caller names the file in its errors.

use serde_json::{Map, Value};

use super::{
    BiasKind, MlaShape, MlpKind, ModelShape, MoeShape, NormKind, PositionKind, RopeTheta,
    ShapeError,
};

mod moe;

/// A config.json as a shape, with what was read and what could not be modelled.
#[derive(Clone, Debug, PartialEq)]
pub struct HfModel {
    /// The shape.
    pub shape: ModelShape,
    /// The config's `model_type`.
    pub model_type: String,
    /// The config's field the sequence length came from (still the config's when a caller
    /// replaces the length: whether it did is the caller's to say).
    pub seq_len_field: &'static str,
    /// Fields read but not modelled, one line each (e.g. a sliding attention window).
    pub notes: Vec<String>,
}

/// Why a config.json is not a shape; each names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HfError {
    /// Not JSON.
    #[error("line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde's message.
        message: String,
    },
    /// JSON, but not an object.
    #[error("not a config.json: the top level is not an object")]
    NotObject,
    /// No `model_type`, or one not read.
    #[error("model_type {0}: reads llama, mistral, qwen2, gpt2, gpt_neox, mixtral, qwen2_moe, qwen3_moe and deepseek_v3")]
    ModelType(String),
    /// A field the family needs is absent.
    #[error("field `{field}` is missing ({model_type} needs it)")]
    Missing {
        /// The field.
        field: &'static str,
        /// The config's `model_type`.
        model_type: String,
    },
    /// A field of the wrong JSON type or out of range.
    #[error("field `{field}` is {got}, expected {want}")]
    Wrong {
        /// The field.
        field: &'static str,
        /// What it is.
        got: String,
        /// What it should be.
        want: &'static str,
    },
    /// A value the model cannot describe.
    #[error("field `{field}` is {value}: {why}")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// Why it cannot be modelled.
        why: String,
    },
    /// Sizes that are not a model.
    #[error("{0}")]
    Shape(#[from] ShapeError),
}

/// One config's fields, read with the family's names.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    model_type: &'a str,
}

impl Fields<'_> {
    fn missing(&self, field: &'static str) -> HfError {
        HfError::Missing {
            field,
            model_type: self.model_type.to_string(),
        }
    }

    /// A positive integer that fits `u32`-sized counts as well as widths, or `None` where the
    /// field is absent or null; a size field at most its [`most`].
    fn count(&self, field: &'static str) -> Result<Option<u64>, HfError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match (v.as_u64(), most(field)) {
                (Some(n), Some((most, want))) if n > most => Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want,
                }),
                (Some(n), _) if n > 0 => Ok(Some(n)),
                _ => Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want: "a positive integer",
                }),
            },
        }
    }

    /// A finite number above 0 (integer or not), or `None` where the field is absent or null.
    fn positive(&self, field: &'static str) -> Result<Option<f64>, HfError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want: "a number above 0",
                }),
            },
        }
    }

    fn need(&self, field: &'static str) -> Result<u64, HfError> {
        self.count(field)?.ok_or_else(|| self.missing(field))
    }

    fn need_u32(&self, field: &'static str) -> Result<u32, HfError> {
        let n = self.need(field)?;
        u32::try_from(n).map_err(|_| HfError::Wrong {
            field,
            got: n.to_string(),
            want: "an integer below 2^32",
        })
    }

    fn flag(&self, field: &'static str, default: bool) -> Result<bool, HfError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(HfError::Wrong {
                field,
                got: v.to_string(),
                want: "true or false",
            }),
        }
    }

    fn text(&self, field: &'static str) -> Result<Option<&str>, HfError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(HfError::Wrong {
                field,
                got: v.to_string(),
                want: "a string",
            }),
        }
    }
}

/// The longest sequence: `max_position_embeddings` and its kin.
const POSITIONS: (u64, &str) = (1 << 27, "a positive integer at most 2^27 (134217728)");

/// The largest value of a size field, far beyond any model's, so that a shape's counts
/// (parameters, and their 16 bytes each of weights, gradients and AdamW state) fit a `u64`:
/// a config past them is refused naming the field, not planned from a count that wrapped.
fn most(field: &str) -> Option<(u64, &'static str)> {
    Some(match field {
        "hidden_size" | "n_embd" => (1 << 20, "a positive integer at most 2^20 (1048576)"),
        "intermediate_size" | "n_inner" | "vocab_size" => {
            (1 << 24, "a positive integer at most 2^24 (16777216)")
        }
        "num_hidden_layers" | "n_layer" => (1 << 12, "a positive integer at most 4096"),
        "max_position_embeddings" | "n_positions" => POSITIONS,
        _ => return None,
    })
}

/// Reads a config.json's text (see the module's note for what is read).
pub fn from_hf_config(text: &str) -> Result<HfModel, HfError> {
    let value: Value = serde_json::from_str(text).map_err(|e| HfError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let map = value.as_object().ok_or(HfError::NotObject)?;
    let model_type = match map.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(HfError::ModelType(v.to_string())),
        None => return Err(HfError::ModelType("(missing)".into())),
    };
    let f = Fields { map, model_type };
    let model = match model_type {
        "llama" | "mistral" | "qwen2" => llama_family(&f)?,
        "gpt2" => gpt2(&f)?,
        "gpt_neox" => gpt_neox(&f)?,
        other => match moe::read(&f) {
            Some(model) => model?,
            None => return Err(HfError::ModelType(format!("`{other}`"))),
        },
    };
    model.shape.check()?;
    Ok(model)
}

/// Llama, Mistral and Qwen2: the same layout under the same names.
fn llama_family(f: &Fields) -> Result<HfModel, HfError> {
    let heads = f.need_u32("num_attention_heads")?;
    let d = f.need("hidden_size")?;
    if let Some(dh) = f.count("head_dim")? {
        if dh.checked_mul(u64::from(heads)) != Some(d) {
            return Err(HfError::Unsupported {
                field: "head_dim",
                value: dh.to_string(),
                why: format!(
                    "heads of width other than hidden_size / num_attention_heads ({d} / {heads}) are not modelled"
                ),
            });
        }
    }
    let mlp = gated_mlp(f)?;
    let (bias, llama_bias) = llama_bias(f)?;
    let (seq_len, seq_len_field) = pretrained_context(f)?;
    let mut notes = Vec::new();
    let rope_theta = rope_theta(f, &["rope_theta"])?;
    if let Some(kind) = rope_scaling(f)? {
        notes.push(format!(
            "rope_scaling `{kind}` is not modelled: the reference GPT's rotary angles are unscaled"
        ));
    }
    let shape = ModelShape {
        layers: f.need_u32("num_hidden_layers")?,
        d_model: d,
        heads,
        kv_heads: f.count("num_key_value_heads")?.map_or(Ok(heads), |n| {
            u32::try_from(n).map_err(|_| HfError::Wrong {
                field: "num_key_value_heads",
                got: n.to_string(),
                want: "an integer below 2^32",
            })
        })?,
        ffn: f.need("intermediate_size")?,
        seq_len,
        vocab: f.need("vocab_size")?,
        mlp,
        norm: NormKind::RmsNorm,
        tied_embeddings: f.flag("tie_word_embeddings", false)?,
        positions: PositionKind::Rotary,
        rope_theta,
        bias,
        head_width: None,
        qk_norm: false,
        mla: None,
        moe: None,
    };
    if bias == BiasKind::All {
        notes.extend(bias_all_note(&shape, llama_bias));
    }
    notes.extend(sliding_window_note(f, seq_len)?);
    Ok(HfModel {
        shape,
        model_type: f.model_type.to_string(),
        seq_len_field,
        notes,
    })
}

/// The gated MLP of `hidden_act`: SwiGLU for silu, GeGLU for gelu's forms.
fn gated_mlp(f: &Fields) -> Result<MlpKind, HfError> {
    match f.text("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => Ok(MlpKind::SwiGlu),
        "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(MlpKind::GeGlu),
        other => Err(HfError::Unsupported {
            field: "hidden_act",
            value: format!("`{other}`"),
            why: "a gated MLP's gate is silu (SwiGLU) or gelu (GeGLU) here".into(),
        }),
    }
}

/// The biases of the llama family: Qwen2's QKV biases; Llama's `attention_bias` and
/// `mlp_bias` (returned too, for the note on how they are planned), else none.
fn llama_bias(f: &Fields) -> Result<(BiasKind, (bool, bool)), HfError> {
    let llama = (
        f.model_type == "llama" && f.flag("attention_bias", false)?,
        f.model_type == "llama" && f.flag("mlp_bias", false)?,
    );
    let bias = match f.model_type {
        "qwen2" => BiasKind::Qkv,
        _ if llama.0 || llama.1 => BiasKind::All,
        _ => BiasKind::None,
    };
    Ok((bias, llama))
}

/// Mistral's sliding window (on by default there, by `use_sliding_window` elsewhere), which
/// the plan does not model, where it is shorter than the context.
fn sliding_window_note(f: &Fields, seq_len: u64) -> Result<Option<String>, HfError> {
    let Some(w) = f.count("sliding_window")? else {
        return Ok(None);
    };
    let on = f.flag("use_sliding_window", f.model_type == "mistral")?;
    Ok((on && w < seq_len).then(|| {
        format!(
            "sliding_window {w} is not modelled: attention is costed over all {seq_len} positions"
        )
    }))
}

/// Llama's `attention_bias` (Q, K, V and output projections) and `mlp_bias` (the MLP's three
/// matrices) planned as [`BiasKind::All`], which also biases an untied LM head, and the other
/// half of each block where only one flag is set: a note of how many bias parameters that
/// adds, if any.
fn bias_all_note(shape: &ModelShape, (attention, mlp): (bool, bool)) -> Option<String> {
    let [qkv, out, up, down] = shape.block_linears();
    let (per_layer, part) = match (attention, mlp) {
        (true, false) => (up.outputs + down.outputs, "its MLP"),
        (false, true) => (qkv.outputs + out.outputs, "its attention"),
        _ => (0, ""),
    };
    let head = if shape.tied_embeddings {
        0
    } else {
        shape.vocab
    };
    let extra = u64::from(shape.layers) * per_layer + head;
    let lacks = match (per_layer > 0, head > 0) {
        (true, true) => format!("{part} and its LM head"),
        (true, false) => part.to_string(),
        (false, true) => "its LM head".to_string(),
        (false, false) => return None,
    };
    Some(format!(
        "attention_bias {attention} and mlp_bias {mlp} are planned as `bias all`, which counts {extra} bias parameters the model lacks (on {lacks})"
    ))
}

/// Rotary positions' base: the first of `fields` given, else `rope_parameters.rope_theta`
/// (the newer layout), else 10000.
fn rope_theta(f: &Fields, fields: &[&'static str]) -> Result<RopeTheta, HfError> {
    for &field in fields {
        if let Some(theta) = f.positive(field)? {
            return RopeTheta::new(theta).map_err(|_| HfError::Wrong {
                field,
                got: theta.to_string(),
                want: "a number above 0",
            });
        }
    }
    const NESTED: &str = "rope_parameters.rope_theta";
    if let Some(Value::Object(p)) = f.map.get("rope_parameters") {
        if let Some(v) = p.get("rope_theta") {
            return v
                .as_f64()
                .and_then(|x| RopeTheta::new(x).ok())
                .ok_or_else(|| HfError::Wrong {
                    field: NESTED,
                    got: v.to_string(),
                    want: "a number above 0",
                });
        }
    }
    Ok(RopeTheta::DEFAULT)
}

/// The kind of a `rope_scaling` (or `rope_parameters`) that changes the angles, if any:
/// its `rope_type` (or older `type`) where that is not `default`.
fn rope_scaling(f: &Fields) -> Result<Option<String>, HfError> {
    for field in ["rope_scaling", "rope_parameters"] {
        let s = match f.map.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(s)) => s,
            // Not silently ignored: a scaling of another form would be planned as none.
            Some(v) => {
                return Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want: "an object (with rope_type or type) or null",
                })
            }
        };
        match s.get("rope_type").or_else(|| s.get("type")) {
            Some(Value::String(kind)) if kind != "default" => return Ok(Some(kind.clone())),
            Some(Value::String(_)) | None => {}
            Some(v) => {
                return Err(HfError::Wrong {
                    field: "rope_scaling.rope_type",
                    got: v.to_string(),
                    want: "a string",
                })
            }
        }
    }
    Ok(None)
}

/// The context the model was pretrained at (see the module's note). transformers 5 writes
/// `rope_scaling` (with `rope_theta`) as `rope_parameters`, so either may name it.
fn pretrained_context(f: &Fields) -> Result<(u64, &'static str), HfError> {
    const ORIGINAL: [(&str, &str); 2] = [
        (
            "rope_scaling",
            "rope_scaling.original_max_position_embeddings",
        ),
        (
            "rope_parameters",
            "rope_parameters.original_max_position_embeddings",
        ),
    ];
    for (object, field) in ORIGINAL {
        let Some(Value::Object(scaling)) = f.map.get(object) else {
            continue;
        };
        if let Some(v) = scaling.get("original_max_position_embeddings") {
            let (most, want) = POSITIONS;
            return match v.as_u64() {
                Some(n) if n > most => Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want,
                }),
                Some(n) if n > 0 => Ok((n, field)),
                _ => Err(HfError::Wrong {
                    field,
                    got: v.to_string(),
                    want: "a positive integer",
                }),
            };
        }
    }
    Ok((
        f.need("max_position_embeddings")?,
        "max_position_embeddings",
    ))
}

/// GeLU-like activations of the plain MLP families.
fn plain_gelu(f: &Fields, field: &'static str) -> Result<(), HfError> {
    match f.text(field)?.unwrap_or("gelu") {
        "gelu" | "gelu_new" | "gelu_fast" | "gelu_pytorch_tanh" | "quick_gelu" => Ok(()),
        other => Err(HfError::Unsupported {
            field,
            value: format!("`{other}`"),
            why: "the plain MLP is costed as GeLU's (an element-wise activation)".into(),
        }),
    }
}

/// GPT-2: its own names; the MLP width `n_inner` defaults to `4 n_embd`.
fn gpt2(f: &Fields) -> Result<HfModel, HfError> {
    plain_gelu(f, "activation_function")?;
    let d = f.need("n_embd")?;
    let shape = ModelShape {
        tied_embeddings: f.flag("tie_word_embeddings", true)?,
        ..ModelShape::gpt(
            f.need_u32("n_layer")?,
            d,
            f.need_u32("n_head")?,
            f.count("n_inner")?.unwrap_or(4 * d),
            f.need("n_positions")?,
            f.need("vocab_size")?,
        )
    };
    Ok(HfModel {
        shape,
        model_type: "gpt2".into(),
        seq_len_field: "n_positions",
        notes: Vec::new(),
    })
}

/// GPT-NeoX (Pythia): Llama's names, a plain GeLU MLP, LayerNorm, rotary positions (on a
/// quarter of each head by default: `rotary_pct`).
fn gpt_neox(f: &Fields) -> Result<HfModel, HfError> {
    plain_gelu(f, "hidden_act")?;
    let (seq_len, seq_len_field) = pretrained_context(f)?;
    let mut notes = Vec::new();
    let pct = f.positive("rotary_pct")?.unwrap_or(0.25);
    if pct < 1.0 {
        notes.push(format!(
            "rotary_pct {pct} is not modelled: the reference GPT turns every dimension of a head"
        ));
    }
    if f.flag("use_parallel_residual", true)? {
        notes.push(
            "use_parallel_residual is not modelled: the reference GPT's MLP reads the residual \
             stream after attention's output is added (the same parameters, FLOPs and bytes)"
                .into(),
        );
    }
    let shape = ModelShape {
        tied_embeddings: f.flag("tie_word_embeddings", false)?,
        positions: PositionKind::Rotary,
        rope_theta: rope_theta(f, &["rope_theta", "rotary_emb_base"])?,
        ..ModelShape::gpt(
            f.need_u32("num_hidden_layers")?,
            f.need("hidden_size")?,
            f.need_u32("num_attention_heads")?,
            f.need("intermediate_size")?,
            seq_len,
            f.need("vocab_size")?,
        )
    };
    Ok(HfModel {
        shape,
        model_type: "gpt_neox".into(),
        seq_len_field,
        notes,
    })
}
