use super::*;

fn gpt3() -> ModelShape {
    ModelShape::gpt(96, 12288, 96, 4 * 12288, 2048, 51200)
}

#[test]
fn the_gpt_blocks_parameters_are_the_reference_gpts() {
    // QKV 3d^2 + 3d, projection d^2 + d, MLP 2df + f + d, two LayerNorms 4d.
    let s = ModelShape::gpt(4, 64, 4, 256, 16, 64);
    let (d, f) = (64, 256);
    assert_eq!(s.block_parameters(1), 4 * d * d + 2 * d * f + 9 * d + f);
    // One of 2 TP ranks: column-parallel weights and biases halved, row-parallel weights
    // halved with their biases whole, norms whole.
    let t = 2;
    let want = 4 * d + (3 * d * d + 3 * d) / t + d * d / t + d + (d * f + f) / t + f * d / t + d;
    assert_eq!(s.block_parameters(t), want);
}

#[test]
fn a_gated_mlp_has_three_matrices_and_gqa_narrower_keys() {
    let base = ModelShape::gpt(1, 4096, 32, 14336, 8192, 1000);
    let llama = ModelShape {
        kv_heads: 8,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        bias: BiasKind::None,
        ..base
    };
    let (d, f, kv) = (4096u64, 14336u64, 1024u64);
    assert_eq!(llama.kv_width(), kv);
    assert_eq!(
        llama.block_parameters(1),
        d * (d + 2 * kv) + d * d + 3 * d * f + 2 * d
    );
    // Issue 26: d_model 16384, 126 layers, ffn 53248 counted as a GeLU MLP is 359B; gated
    // with GQA it is the 405B model.
    let gelu = ModelShape::gpt(126, 16384, 128, 53248, 8192, 128256);
    assert!((gelu.parameters() as f64 / 1e9 - 359.0).abs() < 1.0);
    let llama405 = ModelShape {
        kv_heads: 8,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: PositionKind::Rotary,
        bias: BiasKind::None,
        ..gelu
    };
    assert_eq!(llama405.parameters(), 405_853_388_800);
}

#[test]
fn tied_embeddings_count_once_but_a_last_stage_keeps_its_copy() {
    let gpt2 = ModelShape {
        tied_embeddings: true,
        ..ModelShape::gpt(12, 768, 12, 3072, 1024, 50257)
    };
    assert_eq!(gpt2.parameters(), 124_439_808);
    assert_eq!(gpt2.head_parameters(false), 0);
    assert_eq!(gpt2.head_parameters(true), 50257 * 768);
}

#[test]
fn flops_are_megatrons_formula_at_gpt3s_shape() {
    // Narayanan et al. eq. 3 without recomputation: 72 B s l h^2 (1 + s/6h) + 6 B s h V.
    let m = gpt3();
    let (b, s, l, h, v) = (1536.0, 2048.0, 96.0, 12288.0, 51200.0);
    let want = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h)) + 6.0 * b * s * h * v;
    let got = m.model_flops(b);
    assert!((got / want - 1.0).abs() < 1e-12, "{got} vs {want}");
}

#[test]
fn gqa_and_gating_change_the_flops_by_their_matrices() {
    let m = gpt3();
    let gqa = ModelShape { kv_heads: 8, ..m };
    let (b, s, h) = (1.0, 2048.0, 12288.0);
    // K and V shrink from h to h/12 wide: 2 * 2 * b s h (h - h/12) fewer.
    let fewer = 4.0 * b * s * h * (h - h / 12.0);
    assert!((m.block_flops(b) - gqa.block_flops(b) - fewer).abs() / fewer < 1e-12);
    let gated = ModelShape {
        mlp: MlpKind::SwiGlu,
        ffn: MlpKind::SwiGlu.default_ffn(12288),
        ..m
    };
    // About the same FLOPs as the GeLU MLP of width 4h (the default width keeps them).
    let ratio = gated.block_flops(b) / m.block_flops(b);
    assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
}

#[test]
fn the_default_gated_width_is_llamas() {
    assert_eq!(MlpKind::SwiGlu.default_ffn(4096), 11008);
    assert_eq!(MlpKind::Gelu.default_ffn(4096), 16384);
    assert_eq!(MlpKind::GeGlu.default_ffn(64), 256);
}

#[test]
fn kinds_round_trip_through_their_names() {
    for name in MlpKind::NAMES {
        assert_eq!(name.parse::<MlpKind>().unwrap().name(), *name);
    }
    for name in AttentionKind::NAMES {
        assert_eq!(name.parse::<AttentionKind>().unwrap().to_string(), *name);
    }
    let e = "relu".parse::<MlpKind>().unwrap_err();
    assert!(e.contains("gelu, swiglu, geglu"), "{e}");
}

#[test]
fn old_json_without_the_new_fields_reads_as_the_gpt_it_described() {
    let old = r#"{"layers":2,"d_model":64,"heads":4,"ffn":256,"seq_len":16,"vocab":64}"#;
    let s: ModelShape = serde_json::from_str(old).unwrap();
    assert_eq!(s, ModelShape::gpt(2, 64, 4, 256, 16, 64));
    let back: ModelShape = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn rope_theta_reads_writes_and_refuses_what_is_not_a_base() {
    let json = r#"{"layers":2,"d_model":64,"heads":4,"ffn":256,"seq_len":16,"vocab":64,"positions":"rotary","rope_theta":500000.0}"#;
    let s: ModelShape = serde_json::from_str(json).unwrap();
    assert_eq!(
        (s.positions, s.rope_theta.get()),
        (PositionKind::Rotary, 500_000.0)
    );
    let back: ModelShape = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    assert_eq!(
        ModelShape::gpt(2, 64, 4, 256, 16, 64).rope_theta,
        RopeTheta::DEFAULT
    );
    // The same model whatever its base: no count changes.
    assert_eq!(
        s.parameters(),
        ModelShape {
            rope_theta: RopeTheta::DEFAULT,
            ..s
        }
        .parameters()
    );
    assert_eq!(RopeTheta::DEFAULT.to_string(), "10000");
    assert_eq!("1e6".parse::<RopeTheta>().unwrap().to_string(), "1000000");
    for bad in ["0", "-1", "inf", "NaN", "x"] {
        assert!(bad.parse::<RopeTheta>().is_err(), "{bad}");
    }
    let negative = json.replace("500000.0", "-2");
    let e = serde_json::from_str::<ModelShape>(&negative)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rope_theta must be a finite number above 0"),
        "{e}"
    );
}

#[test]
fn rotary_positions_need_an_even_head_width() {
    let odd = ModelShape::gpt(2, 60, 4, 256, 16, 64);
    odd.check().unwrap();
    let rotary = ModelShape {
        positions: PositionKind::Rotary,
        ..odd
    };
    assert_eq!(rotary.check().unwrap_err(), ShapeError::OddRotaryHead(15));
}

#[test]
fn bad_shapes_are_named() {
    let s = ModelShape {
        kv_heads: 3,
        ..ModelShape::gpt(2, 64, 4, 256, 16, 64)
    };
    assert_eq!(
        s.check().unwrap_err().to_string(),
        "kv_heads (3) must divide heads (4)"
    );
    let s = ModelShape {
        kv_heads: 0,
        ..ModelShape::gpt(2, 64, 4, 256, 16, 64)
    };
    assert_eq!(
        s.check().unwrap_err().to_string(),
        "kv_heads must be positive"
    );
}

/// A tiny mixture: 3 layers, the first dense, 4 SwiGLU experts of width 6 (2 a token) and
/// one shared expert of width 5, RMSNorm, no biases, d 8, vocabulary 10, rotary.
fn tiny_moe() -> ModelShape {
    ModelShape {
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: PositionKind::Rotary,
        bias: BiasKind::None,
        moe: Some(MoeShape {
            route_groups: None,
            experts: 4,
            top_k: 2,
            expert_ffn: 6,
            shared_experts: 1,
            shared_ffn: 5,
            shared_gate: false,
            router_bias: false,
            dense_layers: 1,
            every: 1,
        }),
        ..ModelShape::gpt(3, 8, 2, 12, 4, 10)
    }
}

#[test]
fn a_mixture_counts_every_expert_and_its_flops_the_active_ones() {
    let s = tiny_moe();
    // Attention 4 d^2 = 256; dense MLP 3 d f = 288; an expert 3 d 6 = 144, the shared one
    // 3 d 5 = 120, the router d x 4 = 32; two norms 16; embedding and head 2 V d = 160 and
    // the final norm 8.
    let dense = 256 + 288 + 16;
    let moe_all = 256 + 4 * 144 + 120 + 32 + 16;
    let moe_active = 256 + 2 * 144 + 120 + 32 + 16;
    assert_eq!(s.parameters(), 168 + dense + 2 * moe_all);
    assert_eq!(s.active_parameters(), 168 + dense + 2 * moe_active);
    assert_eq!(s.moe_layers(), 2);
    assert!(!s.is_moe_layer(0) && s.is_moe_layer(1) && s.is_moe_layer(2));
    // Forward FLOPs for one sequence of 4 tokens: 2 a weight a token (norms aside), and the
    // core's 4 s^2 d.
    let core = 4.0 * 16.0 * 8.0;
    assert_eq!(s.layer_flops(false, 1.0), 2.0 * 4.0 * 544.0 + core);
    assert_eq!(
        s.layer_flops(true, 1.0),
        2.0 * 4.0 * (256 + 2 * 144 + 120 + 32) as f64 + core
    );
    let head = 2.0 * 4.0 * 80.0;
    let forward = s.layer_flops(false, 1.0) + 2.0 * s.layer_flops(true, 1.0) + head;
    assert_eq!(s.model_flops(1.0), 3.0 * forward);
    // Every other layer after the dense one: layers 2 (and 4, 6 of a deeper model).
    let sparse = ModelShape {
        moe: s.moe.map(|m| MoeShape { every: 2, ..m }),
        ..s
    };
    assert_eq!(sparse.moe_layers(), 1);
    assert!(!sparse.is_moe_layer(1) && sparse.is_moe_layer(2));
    assert_eq!(sparse.parameters(), 168 + 2 * dense + moe_all);
}

#[test]
fn latent_attention_counts_its_bottlenecks() {
    let s = ModelShape {
        mla: Some(MlaShape {
            q_lora_rank: Some(3),
            kv_lora_rank: 4,
            qk_nope_head_dim: 2,
            qk_rope_head_dim: 2,
            v_head_dim: 3,
        }),
        ..tiny_moe()
    };
    // q: 8 x 3 + norm 3 + 3 x (2 heads x 4); kv: 8 x (4 + 2) + norm 4 + 4 x 2 (2 + 3);
    // out: 2 x 3 x 8.
    let attention = 24 + 3 + 24 + 48 + 4 + 40 + 48;
    assert_eq!(s.attention_parameters(), attention);
    assert_eq!(s.layer_parameters(false, false), attention + 288 + 16);
    // The core: scores over 2 x 4 and context over 2 x 3 per token pair.
    let weights = (24 + 24 + 48 + 40 + 48 + 288) as f64;
    assert_eq!(
        s.layer_flops(false, 1.0),
        2.0 * 4.0 * weights + 2.0 * 16.0 * (8.0 + 6.0)
    );
    let direct = ModelShape {
        mla: s.mla.map(|m| MlaShape {
            q_lora_rank: None,
            ..m
        }),
        ..s
    };
    assert_eq!(direct.attention_parameters(), 8 * 8 + 48 + 4 + 40 + 48);
}

#[test]
fn contradicting_mixture_fields_are_refused_naming_them() {
    let s = tiny_moe();
    let with = |f: fn(&mut MoeShape)| {
        let mut m = s.moe.unwrap();
        f(&mut m);
        ModelShape { moe: Some(m), ..s }
            .check()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        with(|m| m.top_k = 5),
        "top_k 5 is more than the 4 routed experts"
    );
    assert_eq!(with(|m| m.experts = 0), "experts must be positive");
    assert_eq!(
        with(|m| m.shared_ffn = 0),
        "shared_experts 1 and shared_ffn 0: both are 0 or neither"
    );
    assert_eq!(
        with(|m| m.dense_layers = 3),
        "dense_layers 3 and every 1 leave none of the 3 layers an MoE layer"
    );
    assert_eq!(
        with(|m| m.expert_ffn = 1 << 40),
        "expert_ffn 1099511627776 is too large: at most 2^30"
    );
    // Experts whose parameters together pass 2^60.
    let mut m = s.moe.unwrap();
    (m.experts, m.expert_ffn) = (1 << 20, 1 << 29);
    let huge = ModelShape {
        d_model: 1 << 16,
        heads: 1 << 10,
        kv_heads: 1 << 10,
        moe: Some(m),
        ..s
    };
    assert!(matches!(huge.check(), Err(ShapeError::TooLarge { .. })));
    assert_eq!(s.not_modelled(), Some("a mixture of experts"));
    assert_eq!(ModelShape::gpt(2, 8, 2, 32, 4, 10).not_modelled(), None);
}

/// The mixture's flags build the shape and name it in the plan's phrase (the launch line's
/// flags are plan's `launch::kind_flags`).
#[test]
fn mixture_flags_build_describe_and_write_back_the_shape() {
    use super::request::{describe, MoeKinds, ShapeKinds};
    let kinds = ShapeKinds {
        ffn: Some(12),
        mlp: Some(MlpKind::SwiGlu),
        moe: MoeKinds {
            experts: Some(4),
            top_k: Some(2),
            expert_ffn: Some(6),
            shared_experts: Some(1),
            shared_ffn: Some(5),
            dense_layers: Some(1),
            every: None,
            ..MoeKinds::default()
        },
        ..ShapeKinds::default()
    };
    let s = kinds.shape(3, 8, 2, 4, 10).unwrap();
    assert_eq!(s.moe, tiny_moe().moe);
    assert_eq!(
        describe(&s),
        "3 layers x d_model 8 x 2 heads, swiglu 12, 4 experts of 6 (top 2) + 1 shared of 5 after 1 dense, vocab 10, seq 4"
    );
    let dense = ModelShape::gpt(2, 8, 2, 32, 4, 10);
    assert_eq!(
        describe(&dense),
        "2 layers x d_model 8 x 2 heads, gelu 32, vocab 10, seq 4"
    );
}

/// A mixture's refusal names the fields; the CLI writes them as flags and another face in
/// its own words, from the same error.
#[test]
fn a_mixture_refusal_names_fields_each_face_renders() {
    use super::request::{flag_form, MoeKinds};
    let python = |f: &str, v: Option<String>| format!("{f}={}", v.unwrap_or_default());
    let cases: [(MoeKinds, &str, &str); 6] = [
        (
            MoeKinds {
                experts: Some(4),
                ..MoeKinds::default()
            },
            "--experts needs --top-k (the routed experts each token goes to)",
            "experts= needs top_k= (the routed experts each token goes to)",
        ),
        (
            MoeKinds {
                experts: Some(4),
                top_k: Some(5),
                ..MoeKinds::default()
            },
            "--top-k 5 must be at most --experts 4",
            "top_k=5 must be at most experts=4",
        ),
        (
            MoeKinds {
                experts: Some(4),
                top_k: Some(2),
                dense_layers: Some(3),
                ..MoeKinds::default()
            },
            "--dense-layers 3 and --moe-every 1 leave none of the --layers 3 an MoE layer",
            "dense_layers=3 and moe_every=1 leave none of the layers=3 an MoE layer",
        ),
        (
            MoeKinds {
                experts: Some(4),
                top_k: Some(2),
                expert_groups: Some(2),
                ..MoeKinds::default()
            },
            "--expert-groups needs --groups-per-token (group-limited routing takes both)",
            "expert_groups= needs groups_per_token= (group-limited routing takes both)",
        ),
        (
            MoeKinds {
                experts: Some(4),
                top_k: Some(2),
                expert_groups: Some(3),
                groups_per_token: Some(1),
                ..MoeKinds::default()
            },
            "--expert-groups 3 must divide --experts 4",
            "expert_groups=3 must divide experts=4",
        ),
        (
            MoeKinds {
                experts: Some(4),
                top_k: Some(3),
                expert_groups: Some(2),
                groups_per_token: Some(1),
                ..MoeKinds::default()
            },
            "--top-k 3 is more than the 2 experts of --groups-per-token 1 groups of 2",
            "top_k=3 is more than the 2 experts of groups_per_token=1 groups of 2",
        ),
    ];
    for (kinds, cli, py) in cases {
        let e = kinds.moe(3, 8).unwrap_err();
        assert_eq!(e.to_string(), cli);
        assert_eq!(e.named(&flag_form), cli);
        assert_eq!(e.named(&python), py);
    }
}
