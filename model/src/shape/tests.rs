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
