//! Hugging Face config.json files of public models (their shape fields, as published, in
//! `tests/fixtures/hf/`) read as shapes: each model's parameter count against the one its
//! publisher gives, and bad files refused in one line naming the field.
//!
//! Published counts: the Hugging Face model pages' "Model size" (the safetensors weights'
//! parameter total) of meta-llama/Meta-Llama-3-8B (8.03B), meta-llama/Meta-Llama-3-70B
//! (70.6B), meta-llama/Llama-3.1-405B (406B), mistralai/Mistral-7B-v0.1 (7.24B),
//! Qwen/Qwen2-7B (7.62B), openai-community/gpt2 (124M: 124,439,808 with the tied head
//! counted once), EleutherAI/gpt-neox-20b (20.6B; Black et al. 2022 give 20,554,567,680).

use pipewright_model::shape::hf::{from_hf_config, HfError};
use pipewright_model::shape::{BiasKind, MlpKind, ModelShape, NormKind, PositionKind};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `name`'s parameters within `tolerance` (a fraction) of `published`.
fn counts(name: &str, published: f64, tolerance: f64) -> u64 {
    let model = from_hf_config(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let n = model.shape.parameters();
    let err = n as f64 / published - 1.0;
    println!(
        "{name}: {n} parameters, published {published:e} ({:+.3}%)",
        100.0 * err
    );
    assert!(err.abs() <= tolerance, "{name}: {n} vs {published}");
    n
}

#[test]
fn llama_3_configs_give_their_published_counts_within_half_a_percent() {
    assert_eq!(counts("llama3-8b.json", 8.03e9, 0.005), 8_030_261_248);
    assert_eq!(counts("llama3-70b.json", 70.6e9, 0.005), 70_553_706_496);
    assert_eq!(counts("llama3.1-405b.json", 406e9, 0.005), 405_853_388_800);
    let m = from_hf_config(&fixture("llama3.1-405b.json")).unwrap();
    let s = m.shape;
    assert_eq!(
        (s.layers, s.d_model, s.heads, s.kv_heads),
        (126, 16384, 128, 8)
    );
    assert_eq!((s.ffn, s.vocab), (53248, 128256));
    assert_eq!(s.mlp, MlpKind::SwiGlu);
    assert_eq!(s.norm, NormKind::RmsNorm);
    assert_eq!(s.positions, PositionKind::Rotary);
    assert_eq!(s.bias, BiasKind::None);
    assert!(!s.tied_embeddings);
    // The context it was pretrained at, not the extended one.
    assert_eq!(s.seq_len, 8192);
    assert_eq!(
        m.seq_len_field,
        "rope_scaling.original_max_position_embeddings"
    );
}

#[test]
fn every_family_reads_with_its_own_field_names() {
    assert_eq!(counts("mistral-7b-v0.1.json", 7.24e9, 0.005), 7_241_732_096);
    assert_eq!(counts("qwen2-7b.json", 7.62e9, 0.005), 7_615_616_512);
    assert_eq!(counts("gpt2.json", 124_439_808.0, 0.0), 124_439_808);
    // GPT-NeoX's output layer has no bias; the model counts one under `bias all` (50432 of
    // 20.6B).
    counts("gpt-neox-20b.json", 20_554_567_680.0, 1e-5);
    let gpt2 = from_hf_config(&fixture("gpt2.json")).unwrap().shape;
    assert!(gpt2.tied_embeddings);
    assert_eq!((gpt2.ffn, gpt2.seq_len), (3072, 1024));
    assert_eq!(gpt2.positions, PositionKind::Learned);
    let qwen = from_hf_config(&fixture("qwen2-7b.json")).unwrap().shape;
    assert_eq!((qwen.kv_heads, qwen.bias), (4, BiasKind::Qkv));
    let neox = from_hf_config(&fixture("gpt-neox-20b.json")).unwrap().shape;
    assert_eq!((neox.mlp, neox.norm), (MlpKind::Gelu, NormKind::LayerNorm));
    assert_eq!(neox.positions, PositionKind::Rotary);
    // Mistral's sliding window is read and said to be unmodelled past its width.
    let mistral = from_hf_config(&fixture("mistral-7b-v0.1.json")).unwrap();
    assert_eq!(mistral.shape.seq_len, 32768);
    assert_eq!(mistral.notes.len(), 1, "{:?}", mistral.notes);
    assert!(mistral.notes[0].contains("sliding_window 4096"));
}

/// Each family's base of rotary angles, under its own name, and what the reference's plain
/// rotary embeddings leave out said in a note.
#[test]
fn rotary_bases_are_read_and_unmodelled_rotary_variants_noted() {
    let theta = |name: &str| {
        from_hf_config(&fixture(name))
            .unwrap()
            .shape
            .rope_theta
            .get()
    };
    assert_eq!(theta("llama3-8b.json"), 500_000.0);
    assert_eq!(theta("mistral-7b-v0.1.json"), 10_000.0);
    assert_eq!(theta("qwen2-7b.json"), 1_000_000.0);
    assert_eq!(theta("gpt-neox-20b.json"), 10_000.0);
    assert!(from_hf_config(&fixture("llama3-8b.json"))
        .unwrap()
        .notes
        .is_empty());
    let l31 = from_hf_config(&fixture("llama3.1-405b.json")).unwrap();
    assert_eq!(l31.notes.len(), 1, "{:?}", l31.notes);
    assert!(l31.notes[0].contains("rope_scaling `llama3` is not modelled"));
    let neox = from_hf_config(&fixture("gpt-neox-20b.json")).unwrap();
    assert_eq!(neox.notes.len(), 2, "{:?}", neox.notes);
    assert!(neox.notes[0].contains("rotary_pct 0.25 is not modelled"));
    // GPT-NeoX's parallel residual (its default) is a block the reference GPT does not
    // train: said, though it changes no count.
    assert!(neox.notes[1].contains("use_parallel_residual is not modelled"));
    let sequential = fixture("gpt-neox-20b.json").replace(
        "\"use_parallel_residual\": true",
        "\"use_parallel_residual\": false",
    );
    let m = from_hf_config(&sequential).unwrap();
    assert_eq!((m.notes.len(), m.shape), (1, neox.shape));
    // Absent: 10000; in the newer layout, under rope_parameters.
    let llama = fixture("llama3-8b.json");
    let absent = llama.replace("\"rope_theta\": 500000.0,", "");
    assert_eq!(
        from_hf_config(&absent).unwrap().shape.rope_theta.get(),
        10_000.0
    );
    let nested = llama.replace(
        "\"rope_theta\": 500000.0,",
        "\"rope_parameters\": {\"rope_theta\": 250000.0, \"rope_type\": \"default\"},",
    );
    let m = from_hf_config(&nested).unwrap();
    assert_eq!((m.shape.rope_theta.get(), m.notes.len()), (250_000.0, 0));
    let e = |text: &str| from_hf_config(text).unwrap_err().to_string();
    let bad = llama.replace("\"rope_theta\": 500000.0", "\"rope_theta\": -1");
    assert_eq!(
        e(&bad),
        "field `rope_theta` is -1, expected a number above 0"
    );
}

#[test]
fn bad_configs_are_refused_in_one_line_naming_the_field() {
    let llama = fixture("llama3-8b.json");
    let e = |text: &str| from_hf_config(text).unwrap_err().to_string();
    let without = llama.replace("\"num_hidden_layers\": 32,", "");
    assert_eq!(
        e(&without),
        "field `num_hidden_layers` is missing (llama needs it)"
    );
    let wrong = llama.replace("\"hidden_size\": 4096", "\"hidden_size\": \"4096\"");
    assert_eq!(
        e(&wrong),
        "field `hidden_size` is \"4096\", expected a positive integer"
    );
    let act = llama.replace("\"silu\"", "\"relu\"");
    assert!(
        e(&act).starts_with("field `hidden_act` is `relu`: "),
        "{}",
        e(&act)
    );
    let kv = llama.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
    assert_eq!(e(&kv), "kv_heads (5) must divide heads (32)");
    let other = llama.replace("\"llama\"", "\"falcon\"");
    assert_eq!(
        e(&other),
        "model_type `falcon`: reads llama, mistral, qwen2, gpt2, gpt_neox, mixtral, qwen2_moe, qwen3_moe and deepseek_v3"
    );
    assert!(matches!(
        from_hf_config("{\"model_type\": \"llama\",\n  oops}"),
        Err(HfError::Json { line: 2, .. })
    ));
    assert_eq!(
        e("[1, 2]"),
        "not a config.json: the top level is not an object"
    );
    let head_dim = llama.replace("\"hidden_act\"", "\"head_dim\": 160, \"hidden_act\"");
    assert!(
        e(&head_dim).starts_with("field `head_dim` is 160"),
        "{}",
        e(&head_dim)
    );
    for e in [e(&without), e(&wrong), e(&act), e(&kv), e(&other)] {
        assert!(!e.contains('\n'), "{e}");
    }
}

/// transformers 5 saves `rope_scaling` and `rope_theta` together as `rope_parameters`: Llama
/// 3.1's config in that layout still plans at the context it was pretrained at (8192), not
/// the extended 131072 (16 times the tokens a sequence, a different plan).
#[test]
fn the_newer_rope_parameters_layout_gives_the_pretrained_context_too() {
    let old = fixture("llama3.1-405b.json");
    let scaling = old
        .find("\"rope_scaling\"")
        .expect("the fixture has rope_scaling");
    let end = old[scaling..].find("\"tie_word").unwrap() + scaling;
    let new = format!(
        "{}\"rope_parameters\": {{\"factor\": 8.0, \"high_freq_factor\": 4.0, \
         \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \
         \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}},\n  {}",
        &old[..scaling],
        &old[end..]
    );
    assert!(!new.contains("rope_scaling") && !new.contains("\"rope_theta\": 500000.0,\n"));
    let (a, b) = (from_hf_config(&old).unwrap(), from_hf_config(&new).unwrap());
    assert_eq!(b.shape, a.shape);
    assert_eq!(b.shape.seq_len, 8192);
    assert_eq!(
        b.seq_len_field,
        "rope_parameters.original_max_position_embeddings"
    );
    assert_eq!(b.notes, a.notes);
    // A bad value there is named there.
    let bad = new.replace(
        "\"original_max_position_embeddings\": 8192",
        "\"original_max_position_embeddings\": 0",
    );
    assert_eq!(
        from_hf_config(&bad).unwrap_err().to_string(),
        "field `rope_parameters.original_max_position_embeddings` is 0, expected a positive integer"
    );
}

/// Sizes beyond any model are refused naming the field, before a count overflows: a
/// `hidden_size` of 2^32 squared wrapped to 0 in a release build (a plan from a wrong
/// count) and panicked in a debug one. At the largest sizes accepted, the parameters and
/// their 16 bytes each of weights, gradients and AdamW state still fit a u64.
#[test]
fn sizes_beyond_any_model_are_refused_before_the_counts_overflow() {
    let llama = fixture("llama3-8b.json");
    let e = |from: &str, to: &str| {
        let text = llama.replace(from, to);
        assert_ne!(text, llama, "{from}");
        from_hf_config(&text).unwrap_err().to_string()
    };
    assert_eq!(
        e("\"hidden_size\": 4096", "\"hidden_size\": 4294967296"),
        "field `hidden_size` is 4294967296, expected a positive integer at most 2^20 (1048576)"
    );
    assert_eq!(
        e("\"vocab_size\": 128256", "\"vocab_size\": 18446744073709551615"),
        "field `vocab_size` is 18446744073709551615, expected a positive integer at most 2^24 (16777216)"
    );
    assert_eq!(
        e("\"intermediate_size\": 14336", "\"intermediate_size\": 9223372036854775807"),
        "field `intermediate_size` is 9223372036854775807, expected a positive integer at most 2^24 (16777216)"
    );
    assert_eq!(
        e(
            "\"num_hidden_layers\": 32",
            "\"num_hidden_layers\": 4294967295"
        ),
        "field `num_hidden_layers` is 4294967295, expected a positive integer at most 4096"
    );
    assert_eq!(
        e("\"max_position_embeddings\": 8192", "\"max_position_embeddings\": 18446744073709551615"),
        "field `max_position_embeddings` is 18446744073709551615, expected a positive integer at most 2^27 (134217728)"
    );
    let gpt2 = fixture("gpt2.json").replace("\"n_embd\": 768", "\"n_embd\": 4294967296");
    assert!(from_hf_config(&gpt2)
        .unwrap_err()
        .to_string()
        .starts_with("field `n_embd` is 4294967296"));
    // The largest accepted.
    let most = llama
        .replace("\"hidden_size\": 4096", "\"hidden_size\": 1048576")
        .replace(
            "\"intermediate_size\": 14336",
            "\"intermediate_size\": 16777216",
        )
        .replace("\"vocab_size\": 128256", "\"vocab_size\": 16777216")
        .replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": 4096")
        .replace(
            "\"max_position_embeddings\": 8192",
            "\"max_position_embeddings\": 134217728",
        );
    let shape = from_hf_config(&most).unwrap().shape;
    assert!(shape.parameters().checked_mul(16).is_some());
    assert!(ModelShape {
        positions: PositionKind::Learned,
        bias: BiasKind::All,
        ..shape
    }
    .parameters()
    .checked_mul(16)
    .is_some());
}

/// Llama's `attention_bias` and `mlp_bias` are planned as `bias all`, which also counts the
/// biases the model lacks (an LM head's always, and the MLP's or attention's where only the
/// other flag is set): said in a note with their number, not left silent.
#[test]
fn llama_biases_planned_as_bias_all_say_what_they_add() {
    let llama = fixture("llama3-8b.json");
    assert!(from_hf_config(&llama).unwrap().notes.is_empty());
    let with = |attention: bool, mlp: bool| {
        let text = llama.replace(
            "\"hidden_act\"",
            &format!("\"attention_bias\": {attention}, \"mlp_bias\": {mlp}, \"hidden_act\""),
        );
        let m = from_hf_config(&text).unwrap();
        assert_eq!(m.shape.bias, BiasKind::All);
        assert_eq!(m.notes.len(), 1, "{:?}", m.notes);
        m.notes[0].clone()
    };
    // 32 layers: the MLP's gate and up (2 x 14336) and down (4096) biases; the head's 128256.
    let note = with(true, false);
    assert!(
        note.starts_with("attention_bias true and mlp_bias false are planned as `bias all`, which counts 1176832 bias parameters the model lacks"),
        "{note}"
    );
    // Q, K, V (4096 + 2 x 1024) and the output projection (4096): 32 x 10240, and the head.
    assert!(note.ends_with("(on its MLP and its LM head)"), "{note}");
    assert_eq!(note_count(&with(false, true)), 32 * 10240 + 128256);
    assert_eq!(note_count(&with(true, true)), 128256);
    // Tied, with both: nothing is counted that the model lacks, and nothing is said.
    let tied = llama
        .replace(
            "\"tie_word_embeddings\": false",
            "\"tie_word_embeddings\": true",
        )
        .replace(
            "\"hidden_act\"",
            "\"attention_bias\": true, \"mlp_bias\": true, \"hidden_act\"",
        );
    assert_ne!(tied, llama);
    assert!(from_hf_config(&tied).unwrap().notes.is_empty());
}

fn note_count(note: &str) -> u64 {
    let at = note.find("which counts ").expect(note) + "which counts ".len();
    note[at..].split(' ').next().unwrap().parse().unwrap()
}
