//! The reference GPT of a model description: the one conversion from the schedule crate's
//! [`ModelShape`] (what `plan`, the memory model and the CLI read) to the kernels'
//! [`GptConfig`] (what trains), so a planned shape trains as planned.

use pipewright_kernels::gpt::{GptConfig, MoeSpec, Positions};
use pipewright_model::shape::{self, ModelShape, PositionKind};

use crate::error::RuntimeError;

/// The reference GPT of `shape`, or why it has none: it has any key/value heads, MLP, norm,
/// biases and positions (a learned table, or rotary with the shape's base), but untied
/// embeddings only (tying across pipeline stages needs an all-reduce of the two copies'
/// gradients between the first and the last stage, which it does not have).
pub fn gpt_config(shape: &ModelShape) -> Result<GptConfig, RuntimeError> {
    // The reference has a mixture of experts (mapped below); the rest of what the planner
    // does not model yet, it lacks too.
    let without_moe = ModelShape {
        moe: None,
        ..*shape
    };
    if let Some(what) = without_moe.not_modelled() {
        return Err(RuntimeError::Model(format!(
            "the reference GPT does not have {what} yet"
        )));
    }
    if shape.tied_embeddings {
        return Err(RuntimeError::Model(
            "the reference GPT has no tied embeddings: its LM head is its own matrix".into(),
        ));
    }
    let size = |name: &str, v: u64| {
        usize::try_from(v).map_err(|_| RuntimeError::Model(format!("{name} {v} is too large")))
    };
    Ok(GptConfig {
        vocab: size("vocab", shape.vocab)?,
        seq_len: size("seq_len", shape.seq_len)?,
        d_model: size("d_model", shape.d_model)?,
        n_heads: size("heads", shape.heads.into())?,
        kv_heads: size("kv_heads", shape.kv_heads.into())?,
        n_layers: size("layers", shape.layers.into())?,
        d_ff: size("ffn", shape.ffn)?,
        // One definition of each kind (`pipewright-kinds`): the shape's are the kernels'.
        mlp: shape.mlp,
        norm: shape.norm,
        bias: shape.bias,
        positions: match shape.positions {
            PositionKind::Learned => Positions::Learned,
            PositionKind::Rotary => Positions::Rotary {
                theta: shape.rope_theta.get(),
            },
        },
        moe: shape.moe.map(|m| moe_spec(m, shape.bias)).transpose()?,
    })
}

/// The reference's mixture of the shape's. Several shared experts of one width are one
/// shared MLP of their summed width (their outputs add; no expert has a bias). Qwen2's
/// shared gate, DeepSeek's router bias and its group-limited routing are refused: the
/// reference has none of them.
fn moe_spec(m: shape::MoeShape, bias: shape::BiasKind) -> Result<MoeSpec, RuntimeError> {
    let lacks = |what: &str| {
        Err(RuntimeError::Model(format!(
            "the reference GPT's mixture of experts has no {what} yet"
        )))
    };
    if m.shared_gate {
        return lacks("shared-expert gate (shared_gate)");
    }
    if m.router_bias {
        return lacks("router bias (router_bias)");
    }
    if m.route_groups.is_some() {
        return lacks("group-limited routing (expert_groups, groups_per_token)");
    }
    if bias == shape::BiasKind::All {
        // The shape's experts (Hugging Face's) have no biases; the reference's would.
        return Err(RuntimeError::Model(
            "a mixture's experts have no biases, so the other layers cannot have them (bias all): use bias none or qkv".into(),
        ));
    }
    let size = |name: &str, v: u64| {
        usize::try_from(v).map_err(|_| RuntimeError::Model(format!("{name} {v} is too large")))
    };
    Ok(MoeSpec {
        shared_d_ff: size("shared_ffn", u64::from(m.shared_experts) * m.shared_ffn)?,
        dense_first: size("dense_layers", m.dense_layers.into())?,
        every: size("every", m.every.into())?,
        ..MoeSpec::new(
            size("experts", m.experts.into())?,
            size("top_k", m.top_k.into())?,
            size("expert_ffn", m.expert_ffn)?,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_kernels::gpt::GptStage;
    use pipewright_kernels::layers::Parameters;

    /// Every kind the reference has: the built model's parameters are the shape's count.
    #[test]
    fn the_reference_gpt_of_a_shape_has_the_shape_s_parameters() {
        let mut shapes = Vec::new();
        for mlp in [
            shape::MlpKind::Gelu,
            shape::MlpKind::SwiGlu,
            shape::MlpKind::GeGlu,
        ] {
            for norm in [shape::NormKind::LayerNorm, shape::NormKind::RmsNorm] {
                for bias in [
                    shape::BiasKind::All,
                    shape::BiasKind::Qkv,
                    shape::BiasKind::None,
                ] {
                    for kv_heads in [4, 2, 1] {
                        for positions in [PositionKind::Learned, PositionKind::Rotary] {
                            shapes.push(ModelShape {
                                kv_heads,
                                mlp,
                                norm,
                                bias,
                                positions,
                                ..ModelShape::gpt(3, 16, 4, 24, 8, 11)
                            });
                        }
                    }
                }
            }
        }
        for s in shapes {
            let cfg = gpt_config(&s).unwrap();
            let whole = GptStage::whole(&cfg, 0).unwrap();
            assert_eq!(whole.num_params() as u64, s.parameters(), "{s:?}");
        }
        let gpt = ModelShape::gpt(3, 16, 4, 64, 8, 11);
        assert_eq!(gpt_config(&gpt).unwrap(), GptConfig::new(11, 8, 16, 4, 3));
    }

    /// A mixture of experts (GeLU, SwiGLU and GeGLU, with QKV biases or none, shared experts,
    /// dense layers first, one layer in two): the reference built from the shape has the
    /// shape's parameters, so a planned MoE shape trains as counted.
    #[test]
    fn the_reference_gpt_of_an_moe_shape_has_the_shape_s_parameters() {
        for (mlp, bias, shared, every) in [
            (shape::MlpKind::Gelu, shape::BiasKind::None, 1, 1),
            (shape::MlpKind::SwiGlu, shape::BiasKind::None, 2, 2),
            (shape::MlpKind::GeGlu, shape::BiasKind::Qkv, 0, 1),
        ] {
            let s = ModelShape {
                mlp,
                bias,
                moe: Some(shape::MoeShape {
                    route_groups: None,
                    experts: 4,
                    top_k: 2,
                    expert_ffn: 12,
                    shared_experts: shared,
                    shared_ffn: if shared > 0 { 8 } else { 0 },
                    shared_gate: false,
                    router_bias: false,
                    dense_layers: 1,
                    every,
                }),
                ..ModelShape::gpt(5, 16, 4, 64, 8, 11)
            };
            let cfg = gpt_config(&s).unwrap();
            let whole = GptStage::whole(&cfg, 0).unwrap();
            assert_eq!(whole.num_params() as u64, s.parameters(), "{s:?}");
        }
    }

    #[test]
    fn what_the_reference_mixture_lacks_is_refused_by_name() {
        let moe = shape::MoeShape {
            route_groups: None,
            experts: 4,
            top_k: 2,
            expert_ffn: 12,
            shared_experts: 2,
            shared_ffn: 8,
            shared_gate: false,
            router_bias: false,
            dense_layers: 0,
            every: 1,
        };
        let with = |moe| ModelShape {
            moe: Some(moe),
            ..ModelShape::gpt(2, 16, 4, 64, 8, 11)
        };
        for (m, needle) in [
            (moe, "bias all"),
            (
                shape::MoeShape {
                    route_groups: None,
                    shared_gate: true,
                    ..moe
                },
                "shared_gate",
            ),
            (
                shape::MoeShape {
                    route_groups: None,
                    router_bias: true,
                    ..moe
                },
                "router_bias",
            ),
        ] {
            let err = gpt_config(&with(m)).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn rotary_positions_map_with_their_base_and_tied_embeddings_are_refused() {
        let rotary = ModelShape {
            positions: PositionKind::Rotary,
            rope_theta: "500000".parse().unwrap(),
            ..ModelShape::gpt(3, 16, 4, 64, 8, 11)
        };
        let cfg = gpt_config(&rotary).unwrap();
        assert_eq!(cfg.positions, Positions::Rotary { theta: 500_000.0 });
        let tied = ModelShape {
            tied_embeddings: true,
            ..rotary
        };
        let err = gpt_config(&tied).unwrap_err().to_string();
        assert!(err.contains("no tied embeddings"), "{err}");
    }
}
