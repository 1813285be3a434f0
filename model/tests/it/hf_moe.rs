//! Mixtures of experts read from their published Hugging Face config.json (in
//! `tests/fixtures/hf/`): total and active parameter counts, each worked out here by hand
//! from the config's numbers, against the figures their publishers give.
//!
//! Published counts:
//! - Mixtral 8x7B: "46.7B total parameters but only uses 12.9B parameters per token"
//!   (Mistral AI, "Mixtral of experts", 2023-12-11); the safetensors total on the model page
//!   is 46,702,792,704.
//! - Qwen3-235B-A22B: "Number of Parameters: 235B in total and 22B activated" (model card).
//! - DeepSeek-V3: "671B total parameters with 37B activated for each token"; "The total size
//!   of DeepSeek-V3 models on Hugging Face is 685B, which includes 671B of the Main Model
//!   weights and 14B of the Multi-Token Prediction (MTP) Module weights" (model card). The
//!   shape is the main model: 671B, without the MTP module.
//! - Qwen1.5-MoE-A2.7B: "14.3B parameters in total and 2.7B activated parameters during
//!   runtime" (Qwen blog, 2024-03-28).
//!
//! The totals of the three models are met within 0.1%. The active counts are
//! published to two or three digits ("22B", "37B"): they are met to the last digit published
//! (within half a unit of it), which is all such a figure says. Publishers count "active"
//! differently: Mixtral's 12.9B includes the input embedding (without it, 12.75B), DeepSeek's
//! 37B does not (with it, 37.55B); [`ModelShape::active_parameters`] includes it.

use pipewright_model::shape::hf::{from_hf_config, HfError};
use pipewright_model::shape::ModelShape;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn shape(name: &str) -> ModelShape {
    from_hf_config(&fixture(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .shape
}

/// `n` within `fraction` of `published`.
fn near(what: &str, n: u64, published: f64, fraction: f64) {
    let err = n as f64 / published - 1.0;
    println!(
        "{what}: {n}, published {published:e} ({:+.3}%)",
        100.0 * err
    );
    assert!(err.abs() <= fraction, "{what}: {n} vs {published}");
}

/// `n` rounds to `published` at the published digit `unit`.
fn to_the_digit(what: &str, n: u64, published: f64, unit: f64) {
    println!("{what}: {n}, published {published:e} (to {unit:e})");
    assert!((n as f64 - published).abs() <= unit / 2.0, "{what}: {n}");
}

#[test]
fn mixtral_8x7b_is_46_7b_total_12_9b_active() {
    let s = shape("mixtral-8x7b-v0.1.json");
    let (d, f, v, layers) = (4096u64, 14336u64, 32000u64, 32u64);
    // Q and O d x d, K and V d x (8 heads x 128); eight SwiGLU experts of three d x f
    // matrices and a d x 8 router; two RMSNorms a layer; untied embedding and head.
    let attention = 2 * d * d + 2 * d * 1024;
    let expert = 3 * d * f;
    let ends = 2 * v * d + d;
    let total = ends + layers * (attention + 8 * expert + d * 8 + 2 * d);
    let active = ends + layers * (attention + 2 * expert + d * 8 + 2 * d);
    assert_eq!(s.parameters(), total);
    assert_eq!(total, 46_702_792_704);
    assert_eq!(s.active_parameters(), active);
    near("Mixtral total", total, 46.7e9, 0.001);
    to_the_digit("Mixtral active", active, 12.9e9, 0.1e9);
    assert_eq!(s.moe_layers(), 32);
}

#[test]
fn qwen3_235b_a22b_is_235b_total_22b_active() {
    let s = shape("qwen3-235b-a22b.json");
    let (d, v, layers) = (4096u64, 151936u64, 94u64);
    // 64 query heads and 4 key/value heads of 128 (wider than d / heads = 64), an RMSNorm
    // on each query and key head; 128 experts of 3 x d x 1536, 8 a token; no shared expert.
    let attention = 2 * d * 64 * 128 + 2 * d * 4 * 128 + 2 * 128;
    let expert = 3 * d * 1536;
    let ends = 2 * v * d + d;
    let router = d * 128;
    let total = ends + layers * (attention + 128 * expert + router + 2 * d);
    let active = ends + layers * (attention + 8 * expert + router + 2 * d);
    assert_eq!(s.parameters(), total);
    assert_eq!(s.active_parameters(), active);
    near("Qwen3-235B total", total, 235e9, 0.001);
    to_the_digit("Qwen3-235B active", active, 22e9, 1e9);
}

#[test]
fn deepseek_v3_main_model_is_671b_total_37b_active() {
    let m = from_hf_config(&fixture("deepseek-v3.json")).unwrap();
    let s = m.shape;
    let (d, v, h) = (7168u64, 129280u64, 128u64);
    // Latent attention: q 7168 -> 1536 (norm) -> 128 x 192; kv 7168 -> 512 + 64, norm,
    // 512 -> 128 x (128 + 128); out 128 x 128 -> 7168.
    let attention = d * 1536 + 1536 + 1536 * h * 192 + d * 576 + 512 + 512 * h * 256 + h * 128 * d;
    let dense_mlp = 3 * d * 18432;
    let expert = 3 * d * 2048;
    // Router d x 256 with its 256 load-balancing biases.
    let router = d * 256 + 256;
    let ends = 2 * v * d + d;
    let dense = attention + dense_mlp + 2 * d;
    let total_moe = attention + (256 + 1) * expert + router + 2 * d;
    let active_moe = attention + (8 + 1) * expert + router + 2 * d;
    let total = ends + 3 * dense + 58 * total_moe;
    let active = ends + 3 * dense + 58 * active_moe;
    assert_eq!(s.parameters(), total);
    assert_eq!(s.active_parameters(), active);
    near("DeepSeek-V3 total (main model)", total, 671e9, 0.001);
    // 37.55B with the input embedding, a lookup that multiplies nothing; DeepSeek's 37B is
    // the count without it (36.63B), as Mixtral's 12.9B is the count with it.
    assert_eq!(active, 37_552_297_472);
    to_the_digit(
        "DeepSeek-V3 active without the input embedding",
        active - s.embedding_parameters(),
        37e9,
        1e9,
    );
    assert_eq!((s.moe_layers(), s.layers), (58, 61));
    // Node-limited routing: a token's 8 experts from the best 4 of 8 groups.
    let groups = s.moe.and_then(|m| m.route_groups);
    let want = pipewright_model::shape::RouteGroups {
        groups: 8,
        per_token: 4,
    };
    assert_eq!(groups, Some(want));
    assert!(!s.is_moe_layer(2) && s.is_moe_layer(3));
    // The sequence it was pretrained at (YaRN extended it from 4096).
    assert_eq!(s.seq_len, 4096);
    assert!(
        m.notes.iter().any(|n| n.contains("multi-token-prediction")),
        "{:?}",
        m.notes
    );
}

#[test]
fn qwen1_5_moe_is_14_3b_total_2_7b_active() {
    let s = shape("qwen1.5-moe-a2.7b.json");
    let (d, v, layers) = (2048u64, 151936u64, 24u64);
    // Q, K, V with biases; 60 experts of 3 x d x 1408, 4 a token; one shared expert of
    // 3 x d x 5632 behind a d -> 1 gate; router d x 60.
    let attention = 4 * d * d + 3 * d;
    let (expert, shared) = (3 * d * 1408, 3 * d * 5632);
    let ends = 2 * v * d + d;
    let rest = attention + shared + d * 60 + d + 2 * d;
    let total = ends + layers * (rest + 60 * expert);
    let active = ends + layers * (rest + 4 * expert);
    assert_eq!(s.parameters(), total);
    assert_eq!(s.active_parameters(), active);
    // 14.316B: 0.11% above the three digits published, which it rounds to.
    to_the_digit("Qwen1.5-MoE total", total, 14.3e9, 0.1e9);
    to_the_digit("Qwen1.5-MoE active", active, 2.7e9, 0.1e9);
}

/// FLOPs count the experts a token goes through, parameters all of them: a dense shape's
/// FLOPs are the same whichever way counted, an MoE layer's scale with top_k.
#[test]
fn flops_follow_the_active_experts() {
    let s = shape("mixtral-8x7b-v0.1.json");
    let b = 1.0;
    let tokens = s.seq_len as f64;
    let per_token_weights = (s.active_parameters() - 2 * s.embedding_parameters()) as f64;
    // Forward: 2 FLOPs a weight a token (norms aside), the attention core and the head.
    let core = 4.0 * tokens * tokens * 4096.0 * 32.0;
    let layers = s.model_flops(b) / 3.0 - s.head_flops(b);
    let norms = (32 * 2 * 4096 + 4096) as f64;
    let routers = 0.0;
    let want = 2.0 * tokens * (per_token_weights - norms + routers) + core;
    assert!((layers / want - 1.0).abs() < 1e-12, "{layers} vs {want}");
    let two = ModelShape {
        moe: s
            .moe
            .map(|m| pipewright_model::shape::MoeShape { top_k: 4, ..m }),
        ..s
    };
    let expert = 2.0 * tokens * (3 * 4096 * 14336) as f64;
    let more = two.layer_flops(true, b) - s.layer_flops(true, b);
    assert!((more / (2.0 * expert) - 1.0).abs() < 1e-12);
    assert_eq!(two.parameters(), s.parameters());
}

#[test]
fn contradicting_fields_are_refused_naming_them() {
    let mixtral = fixture("mixtral-8x7b-v0.1.json");
    let e = |text: &str| from_hf_config(text).unwrap_err().to_string();
    let k = mixtral.replace("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
    assert_eq!(
        e(&k),
        "field `num_experts_per_tok` is 9: a token goes to at most the 8 experts of num_local_experts"
    );
    let none = mixtral.replace("\"num_local_experts\": 8,", "");
    assert_eq!(
        e(&none),
        "field `num_local_experts` is missing (mixtral needs it)"
    );
    let ds = fixture("deepseek-v3.json");
    let freq = ds.replace("\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2");
    assert!(
        e(&freq).starts_with("field `moe_layer_freq` is 2: "),
        "{}",
        e(&freq)
    );
    let all_dense = ds.replace(
        "\"first_k_dense_replace\": 3",
        "\"first_k_dense_replace\": 61",
    );
    assert_eq!(
        e(&all_dense),
        "field `first_k_dense_replace` is 61: it leaves none of the 61 layers (num_hidden_layers) a mixture of experts"
    );
    let no_rank = ds.replace("\"kv_lora_rank\": 512,", "");
    assert_eq!(
        e(&no_rank),
        "field `kv_lora_rank` is missing (deepseek_v3 needs it)"
    );
    let groups = ds.replace("\"n_group\": 8", "\"n_group\": 7");
    assert_eq!(
        e(&groups),
        "field `n_group` is 7: it must divide the 256 experts of n_routed_experts"
    );
    let over = ds.replace("\"topk_group\": 4", "\"topk_group\": 9");
    assert_eq!(
        e(&over),
        "field `topk_group` is 9: it must be 1 to n_group 8"
    );
    let few = ds.replace("\"n_group\": 8", "\"n_group\": 256");
    let few = few.replace("\"topk_group\": 4", "\"topk_group\": 2");
    assert_eq!(
        e(&few),
        "field `topk_group` is 2: its 2 groups of 1 experts hold fewer than num_experts_per_tok 8"
    );
    // A field the file does not give is transformers' default, and said to be absent.
    let small = ds.replace("\"n_group\": 8,", "");
    let small = small.replace("\"n_routed_experts\": 256", "\"n_routed_experts\": 4");
    let small = small.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 2");
    assert_eq!(
        e(&small),
        "field `n_group` is absent (transformers' default 8): it must divide the 4 experts of n_routed_experts"
    );
    // One group, or every group a token: no limit.
    let all = ds.replace("\"topk_group\": 4", "\"topk_group\": 8");
    let all = from_hf_config(&all).unwrap().shape;
    assert_eq!(all.moe.and_then(|m| m.route_groups), None);
    let odd = ds.replace("\"qk_rope_head_dim\": 64", "\"qk_rope_head_dim\": 63");
    assert!(e(&odd).starts_with("qk_rope_head_dim 63"), "{}", e(&odd));
    let qwen = fixture("qwen3-235b-a22b.json");
    let gaps = qwen.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [5]");
    assert!(
        e(&gaps).starts_with("field `mlp_only_layers` is [5]: "),
        "{}",
        e(&gaps)
    );
    // Step 2 with one dense layer first: Qwen's count from layer 0 puts the mixtures on 1, 3,
    // 5, ...; a shape's count from the first layer after the dense ones would put them on 2,
    // 4, ...: refused. Two dense layers (a whole step) agree, and are read.
    let step2 = qwen.replace("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2");
    let shifted = step2.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]");
    assert!(
        e(&shifted)
            .starts_with("field `mlp_only_layers` is the first 1: with decoder_sparse_step 2"),
        "{}",
        e(&shifted)
    );
    let whole = step2.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 1]");
    let m = from_hf_config(&whole).unwrap().shape.moe.unwrap();
    assert_eq!((m.dense_layers, m.every), (2, 2));
    assert!(!m.is_moe_layer(2) && m.is_moe_layer(3) && m.is_moe_layer(5));
    let oss = mixtral.replace("\"mixtral\"", "\"gpt_oss\"");
    assert!(e(&oss).starts_with("field `model_type` is `gpt_oss`: its attention sinks"));
    for text in [
        &k, &none, &freq, &all_dense, &no_rank, &odd, &gaps, &shifted, &oss,
    ] {
        assert!(!e(text).contains('\n'));
    }
    assert!(matches!(
        from_hf_config(&k),
        Err(HfError::Unsupported {
            field: "num_experts_per_tok",
            ..
        })
    ));
}

/// A dense shape's JSON has none of the new fields, and an MoE shape's reads back the same.
#[test]
fn shapes_write_and_read_back() {
    let dense = ModelShape::gpt(2, 64, 4, 256, 16, 100);
    let text = serde_json::to_string(&dense).unwrap();
    assert!(!text.contains("moe") && !text.contains("mla") && !text.contains("qk_norm"));
    for name in ["deepseek-v3.json", "qwen3-235b-a22b.json"] {
        let s = shape(name);
        let back: ModelShape = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
