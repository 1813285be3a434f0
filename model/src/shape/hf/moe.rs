//! The mixture-of-experts families of [`super::from_hf_config`]: `mixtral`, `qwen2_moe`,
//! `qwen3_moe` and `deepseek_v3` (with its multi-head latent attention), each read with its
//! `transformers` configuration class's names and defaults. `gpt_oss` is refused, naming what
//! it has that a shape cannot say.
//!
//! Which layers are MoE layers, as each family's modelling code decides:
//! - Mixtral: all of them.
//! - Qwen-MoE: layer `i` where `(i + 1) % decoder_sparse_step == 0` and `i` is not in
//!   `mlp_only_layers` (read where that list is empty or the first layers in order, which
//!   are [`MoeShape::dense_layers`], and where those are a multiple of the step: refused
//!   otherwise, as the two counts would place the mixtures differently).
//! - DeepSeek-V3: layer `i >= first_k_dense_replace` where `i % moe_layer_freq == 0`; read
//!   where `moe_layer_freq` is 1 (every published config), refused otherwise.

use serde_json::Value;

use super::{
    pretrained_context, rope_scaling, rope_theta, Fields, HfError, HfModel, MlaShape, MlpKind,
    ModelShape, MoeShape, NormKind, PositionKind,
};
use crate::shape::{BiasKind, GroupsError, RouteGroups};

/// Reads a family of this module's, or refuses `gpt_oss`; `None` for another `model_type`.
pub(super) fn read(f: &Fields) -> Option<Result<HfModel, HfError>> {
    Some(match f.model_type {
        "mixtral" => mixtral(f),
        "qwen2_moe" | "qwen3_moe" => qwen_moe(f),
        "deepseek_v3" => deepseek_v3(f),
        "gpt_oss" => Err(HfError::Unsupported {
            field: "model_type",
            value: "`gpt_oss`".into(),
            why: "its attention sinks (a learned logit per head), its experts' biases and its \
                  clamped SwiGLU are not modelled by a shape"
                .into(),
        }),
        _ => return None,
    })
}

/// An expert count or width, at most 2^20 experts and 2^24 wide (far beyond any model's).
fn bounded(f: &Fields, field: &'static str, most: u64) -> Result<Option<u64>, HfError> {
    match f.count(field)? {
        Some(n) if n > most => Err(HfError::Wrong {
            field,
            got: n.to_string(),
            want: if most == 1 << 20 {
                "a positive integer at most 2^20"
            } else {
                "a positive integer at most 2^24"
            },
        }),
        n => Ok(n),
    }
}

/// `num_experts_per_tok` read against the experts (`experts_field`), refused naming it
/// where it asks for more experts than there are.
fn top_k(f: &Fields, experts_field: &'static str, experts: u32) -> Result<u32, HfError> {
    let k = self::experts(f, "num_experts_per_tok")?;
    if k > experts {
        return Err(HfError::Unsupported {
            field: "num_experts_per_tok",
            value: k.to_string(),
            why: format!("a token goes to at most the {experts} experts of {experts_field}"),
        });
    }
    Ok(k)
}

/// Dense layers before the first MoE layer (`field`), refused naming it where it leaves none.
fn dense_prefix(f: &Fields, field: &'static str, dense: u32) -> Result<u32, HfError> {
    let layers = f.need_u32("num_hidden_layers")?;
    if dense >= layers {
        return Err(HfError::Unsupported {
            field,
            value: dense.to_string(),
            why: format!(
                "it leaves none of the {layers} layers (num_hidden_layers) a mixture of experts"
            ),
        });
    }
    Ok(dense)
}

fn experts(f: &Fields, field: &'static str) -> Result<u32, HfError> {
    let n = bounded(f, field, 1 << 20)?.ok_or_else(|| f.missing(field))?;
    Ok(n as u32)
}

fn width(f: &Fields, field: &'static str) -> Result<u64, HfError> {
    bounded(f, field, 1 << 24)?.ok_or_else(|| f.missing(field))
}

/// The silu-gated MLP every family here has (`hidden_act` `silu`, its default).
fn swiglu(f: &Fields) -> Result<MlpKind, HfError> {
    match f.text("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => Ok(MlpKind::SwiGlu),
        other => Err(HfError::Unsupported {
            field: "hidden_act",
            value: format!("`{other}`"),
            why: format!("{}'s experts are silu-gated (SwiGLU)", f.model_type),
        }),
    }
}

/// The Llama-like fields these families share: a shape of `ffn` with rotary positions,
/// RMSNorm and no biases, with the notes of its rotary scaling and sliding window.
fn base(f: &Fields, ffn: u64, notes: &mut Vec<String>) -> Result<ModelShape, HfError> {
    let heads = f.need_u32("num_attention_heads")?;
    let (seq_len, _) = pretrained_context(f)?;
    if let Some(kind) = rope_scaling(f)? {
        notes.push(format!(
            "rope_scaling `{kind}` is not modelled: the reference GPT's rotary angles are unscaled"
        ));
    }
    if let Some(w) = f.count("sliding_window")? {
        if f.flag("use_sliding_window", f.model_type == "mixtral")? && w < seq_len {
            notes.push(format!(
                "sliding_window {w} is not modelled: attention is costed over all {seq_len} positions"
            ));
        }
    }
    let kv_heads = match f.count("num_key_value_heads")? {
        None => heads,
        Some(n) => u32::try_from(n).map_err(|_| HfError::Wrong {
            field: "num_key_value_heads",
            got: n.to_string(),
            want: "an integer below 2^32",
        })?,
    };
    Ok(ModelShape {
        kv_heads,
        mlp: swiglu(f)?,
        norm: NormKind::RmsNorm,
        tied_embeddings: f.flag("tie_word_embeddings", false)?,
        positions: PositionKind::Rotary,
        rope_theta: rope_theta(f, &["rope_theta"])?,
        bias: BiasKind::None,
        ..ModelShape::gpt(
            f.need_u32("num_hidden_layers")?,
            f.need("hidden_size")?,
            heads,
            ffn,
            seq_len,
            f.need("vocab_size")?,
        )
    })
}

fn model(f: &Fields, shape: ModelShape, notes: Vec<String>) -> Result<HfModel, HfError> {
    let (_, seq_len_field) = pretrained_context(f)?;
    Ok(HfModel {
        shape,
        model_type: f.model_type.to_string(),
        seq_len_field,
        notes,
    })
}

/// Mixtral: Mistral's attention, every layer's MLP `num_local_experts` experts of
/// `intermediate_size`, `num_experts_per_tok` of them a token.
fn mixtral(f: &Fields) -> Result<HfModel, HfError> {
    let ffn = width(f, "intermediate_size")?;
    let mut notes = Vec::new();
    let mut shape = base(f, ffn, &mut notes)?;
    let n = experts(f, "num_local_experts")?;
    shape.moe = Some(MoeShape {
        route_groups: None,
        experts: n,
        top_k: top_k(f, "num_local_experts", n)?,
        expert_ffn: ffn,
        shared_experts: 0,
        shared_ffn: 0,
        shared_gate: false,
        router_bias: false,
        dense_layers: 0,
        every: 1,
    });
    model(f, shape, notes)
}

/// The first layers `mlp_only_layers` names (`0, 1, .., k-1`), or why the list is not that.
fn mlp_only_prefix(f: &Fields) -> Result<u32, HfError> {
    const FIELD: &str = "mlp_only_layers";
    let list = match f.map.get(FIELD) {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(HfError::Wrong {
                field: FIELD,
                got: v.to_string(),
                want: "a list of layer indices",
            })
        }
    };
    let prefix = list
        .iter()
        .enumerate()
        .all(|(i, v)| v.as_u64() == Some(i as u64));
    if !prefix {
        return Err(HfError::Unsupported {
            field: FIELD,
            value: Value::Array(list.clone()).to_string(),
            why: "dense layers are modelled as the first ones only (0, 1, .., k-1)".into(),
        });
    }
    Ok(list.len() as u32)
}

/// Qwen2-MoE and Qwen3-MoE: `num_experts` experts of `moe_intermediate_size` in every
/// `decoder_sparse_step`-th layer, the others dense of `intermediate_size`. Qwen2-MoE adds a
/// gated shared expert of `shared_expert_intermediate_size` and biases on Q, K and V; Qwen3
/// has heads of `head_dim` (default 128) with RMSNorms on each query and key head.
fn qwen_moe(f: &Fields) -> Result<HfModel, HfError> {
    let qwen3 = f.model_type == "qwen3_moe";
    let ffn = width(f, "intermediate_size")?;
    let mut notes = Vec::new();
    let mut shape = base(f, ffn, &mut notes)?;
    let shared = match qwen3 {
        true => 0,
        false => bounded(f, "shared_expert_intermediate_size", 1 << 24)?.unwrap_or(0),
    };
    let n = experts(f, "num_experts")?;
    shape.moe = Some(MoeShape {
        route_groups: None,
        experts: n,
        top_k: top_k(f, "num_experts", n)?,
        expert_ffn: width(f, "moe_intermediate_size")?,
        shared_experts: u32::from(shared > 0),
        shared_ffn: shared,
        shared_gate: shared > 0,
        router_bias: false,
        dense_layers: dense_prefix(f, "mlp_only_layers", mlp_only_prefix(f)?)?,
        every: bounded(f, "decoder_sparse_step", 1 << 20)?.unwrap_or(1) as u32,
    });
    sparse_step_fits(shape.moe.as_ref())?;
    if qwen3 {
        shape.head_width = Some(bounded(f, "head_dim", 1 << 20)?.unwrap_or(128));
        shape.qk_norm = true;
        if f.flag("attention_bias", false)? {
            return Err(HfError::Unsupported {
                field: "attention_bias",
                value: "true".into(),
                why: "Qwen3-MoE's attention is modelled without biases".into(),
            });
        }
    } else {
        shape.bias = BiasKind::Qkv;
    }
    model(f, shape, notes)
}

/// DeepSeek-V3: multi-head latent attention; `first_k_dense_replace` dense layers of
/// `intermediate_size`, then MoE layers of `n_routed_experts` experts and `n_shared_experts`
/// shared ones, all `moe_intermediate_size` wide, with the router's load-balancing bias
/// (`topk_method` `noaux_tc`). The multi-token-prediction module
/// (`num_nextn_predict_layers`) is not part of the shape: a note says so.
fn deepseek_v3(f: &Fields) -> Result<HfModel, HfError> {
    let ffn = width(f, "intermediate_size")?;
    let mut notes = Vec::new();
    let mut shape = base(f, ffn, &mut notes)?;
    shape.kv_heads = shape.heads;
    if let Some(freq) = f.count("moe_layer_freq")?.filter(|&n| n != 1) {
        return Err(HfError::Unsupported {
            field: "moe_layer_freq",
            value: freq.to_string(),
            why: "every layer after first_k_dense_replace is modelled as an MoE layer (1)".into(),
        });
    }
    let expert_ffn = width(f, "moe_intermediate_size")?;
    let shared = bounded(f, "n_shared_experts", 1 << 20)?.unwrap_or(0) as u32;
    let dense = f.map.get("first_k_dense_replace");
    let dense_layers = match dense {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| HfError::Wrong {
                field: "first_k_dense_replace",
                got: v.to_string(),
                want: "an integer from 0",
            })?,
    };
    let n = experts(f, "n_routed_experts")?;
    let k = top_k(f, "n_routed_experts", n)?;
    shape.moe = Some(MoeShape {
        route_groups: route_groups(f, n, k)?,
        experts: n,
        top_k: k,
        expert_ffn,
        shared_experts: shared,
        shared_ffn: if shared > 0 { expert_ffn } else { 0 },
        shared_gate: false,
        router_bias: f.text("topk_method")?.unwrap_or("noaux_tc") == "noaux_tc",
        dense_layers: dense_prefix(f, "first_k_dense_replace", dense_layers)?,
        every: 1,
    });
    shape.mla = Some(MlaShape {
        q_lora_rank: bounded(f, "q_lora_rank", 1 << 20)?,
        kv_lora_rank: bounded(f, "kv_lora_rank", 1 << 20)?
            .ok_or_else(|| f.missing("kv_lora_rank"))?,
        qk_nope_head_dim: bounded(f, "qk_nope_head_dim", 1 << 20)?
            .ok_or_else(|| f.missing("qk_nope_head_dim"))?,
        qk_rope_head_dim: bounded(f, "qk_rope_head_dim", 1 << 20)?
            .ok_or_else(|| f.missing("qk_rope_head_dim"))?,
        v_head_dim: bounded(f, "v_head_dim", 1 << 20)?.ok_or_else(|| f.missing("v_head_dim"))?,
    });
    if let Some(n) = f.count("num_nextn_predict_layers")? {
        notes.push(format!(
            "num_nextn_predict_layers {n} is not modelled: the shape is the main model, without its multi-token-prediction module"
        ));
    }
    model(f, shape, notes)
}

/// DeepSeek-V3's group-limited routing: `n_group` groups of experts, a token's from the
/// `topk_group` best (`transformers`' defaults 8 and 4, which its router always applies).
/// `None` where the groups limit nothing.
fn route_groups(f: &Fields, experts: u32, top_k: u32) -> Result<Option<RouteGroups>, HfError> {
    let (given_g, given_m) = (
        bounded(f, "n_group", 1 << 20)?,
        bounded(f, "topk_group", 1 << 20)?,
    );
    let groups = RouteGroups {
        groups: given_g.unwrap_or(8) as u32,
        per_token: given_m.unwrap_or(4) as u32,
    };
    // A refusal quotes the value the file gave, or says the field is absent and the
    // default was taken.
    let unsupported = |field, value: u32, why: String| {
        let given = if field == "n_group" { given_g } else { given_m };
        HfError::Unsupported {
            field,
            value: match given {
                Some(_) => value.to_string(),
                None => format!("absent (transformers' default {value})"),
            },
            why,
        }
    };
    let Err(e) = groups.check(experts, top_k) else {
        return Ok(groups.limiting());
    };
    // Blame `n_group` first where it does not divide the experts, as the config reads.
    let g = groups.groups;
    if g == 0 || experts % g != 0 {
        let why = format!("it must divide the {experts} experts of n_routed_experts");
        return Err(unsupported("n_group", g, why));
    }
    let why = match e {
        GroupsError::TooFew { per_group, .. } => format!(
            "its {} groups of {per_group} experts hold fewer than num_experts_per_tok {top_k}",
            groups.per_token
        ),
        _ => format!("it must be 1 to n_group {g}"),
    };
    Err(unsupported("topk_group", groups.per_token, why))
}

/// Qwen-MoE counts `decoder_sparse_step` from layer 0 and then drops `mlp_only_layers`; a
/// shape counts `every` from the first layer after its dense ones. The two agree where the
/// dense layers are a whole number of steps (or the step is 1); otherwise refuse rather than
/// place the mixtures on the wrong layers.
fn sparse_step_fits(moe: Option<&MoeShape>) -> Result<(), HfError> {
    match moe {
        Some(m) if m.every > 1 && m.dense_layers % m.every != 0 => Err(HfError::Unsupported {
            field: "mlp_only_layers",
            value: format!("the first {}", m.dense_layers),
            why: format!(
                "with decoder_sparse_step {} the mixtures sit on layers counted from 0, which a \
                 dense prefix of {} layers (not a multiple of the step) would shift",
                m.every, m.dense_layers
            ),
        }),
        _ => Ok(()),
    }
}
