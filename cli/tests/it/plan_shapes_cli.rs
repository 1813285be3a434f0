//! `plan` on today's shapes end to end: the launch line of a small model in each new shape
//! (grouped-query attention with SwiGLU, RMSNorm and rotary positions, multi-query attention
//! with GeGLU) trains that very shape (run in-process in place of over NCCL), `plan
//! --validate` measures it against the memory model's prediction, the committed Llama 3
//! config.json at a small size plans and trains, and a shape the reference GPT lacks (tied
//! embeddings) is refused in one line.

use crate::common;

use std::path::Path;

/// A small Llama-shaped model (2 key/value heads of 4, SwiGLU of width 48, RMSNorm, rotary
/// positions of Llama 3's base, no biases), fixed to TP 2 with sequence parallelism (one
/// key/value head a rank), and a multi-query GeGLU one with a QKV bias, on 2 CPU "GPUs".
const SHAPES: [&[&str]; 2] = [
    &[
        "--kv-heads",
        "2",
        "--mlp",
        "swiglu",
        "--ffn",
        "48",
        "--norm",
        "rmsnorm",
        "--positions",
        "rotary",
        "--rope-theta",
        "500000",
        "--bias",
        "none",
        "--tp",
        "2",
        "--sequence-parallel",
    ],
    &[
        "--kv-heads",
        "1",
        "--mlp",
        "geglu",
        "--ffn",
        "48",
        "--bias",
        "qkv",
    ],
];

fn plan_args<'a>(kinds: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--layers",
        "2",
        "--d-model",
        "16",
        "--heads",
        "4",
        "--seq-len",
        "8",
        "--vocab",
        "32",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--precision",
        "f32",
    ];
    args.extend_from_slice(kinds);
    args.extend_from_slice(extra);
    args
}

/// The launch line of `plan`'s output `out` (2 GPUs), checked to carry no refusal note.
fn launch_line(out: &str) -> &str {
    assert!(!out.contains("train refuses"), "{out}");
    out.lines()
        .find(|l| l.trim_start().starts_with("mpirun -np 2 pipewright train"))
        .unwrap_or_else(|| panic!("no launch line in {out}"))
}

/// Runs a launch line for 3 steps, in-process instead of one process per GPU over NCCL;
/// every step has a loss.
fn train_launch_line(launch: &str) {
    let (_, train) = launch.split_once("pipewright ").unwrap();
    let train = train.replace("--transport nccl", "--transport local");
    let mut args: Vec<&str> = train.split_whitespace().collect();
    args.extend(["--steps", "3", "--format", "json"]);
    let lines = common::ok(&args);
    let steps: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 3, "{lines}");
    assert!(
        steps.iter().all(|s| s["loss"].as_f64().unwrap() > 0.0),
        "{lines}"
    );
}

#[test]
fn the_launch_line_trains_the_planned_shape() {
    for kinds in SHAPES {
        let out = common::plan::ok(&plan_args(kinds, &[]));
        let launch = launch_line(&out);
        // Every kind of the plan's shape (and its fixed TP) is on the line.
        for flag in kinds.iter().filter(|w| w.starts_with("--")) {
            assert!(launch.contains(flag), "{flag} not in {launch}");
        }
        train_launch_line(launch);
    }
}

/// The committed Llama 3 8B config.json with its sizes made small (2 layers of width 16, 4
/// heads reading 2 key/value heads, SwiGLU of 48, a vocabulary of 32) and every other field
/// as published: RMSNorm, no biases, untied embeddings, rotary positions of base 500000.
/// `plan --hf-config` plans it, its launch line names the rotary positions and their base,
/// and `train` runs it.
#[test]
fn the_llama_config_plans_and_trains_at_a_small_size() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf/llama3-8b.json");
    let text = std::fs::read_to_string(&fixture).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (field, small) in [
        ("num_hidden_layers", 2),
        ("hidden_size", 16),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("intermediate_size", 48),
        ("vocab_size", 32),
        ("max_position_embeddings", 8),
    ] {
        assert!(config.get(field).is_some(), "{field}");
        config[field] = small.into();
    }
    assert_eq!(config["rope_theta"], 500_000.0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let path = path.to_str().unwrap();
    let args = [
        "--hf-config",
        path,
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--precision",
        "f32",
        "--tp",
        "2",
    ];
    let out = common::plan::ok(&args);
    assert!(out.contains("rmsnorm, rotary"), "{out}");
    let launch = launch_line(&out);
    for flag in [
        "--positions rotary --rope-theta 500000",
        "--kv-heads 2",
        "--mlp swiglu",
        "--norm rmsnorm",
        "--bias none",
        "--tp 2",
    ] {
        assert!(launch.contains(flag), "{flag} not in {launch}");
    }
    train_launch_line(launch);
}

#[test]
fn validate_measures_the_planned_shape_as_the_memory_model_predicts() {
    for kinds in SHAPES {
        let out = common::plan::ok(&plan_args(kinds, &["--validate", "2"]));
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("validation: "))
            .skip(2)
            .take_while(|l| !l.starts_with("largest") && !l.starts_with("Spearman"))
            .collect();
        assert_eq!(rows.len(), 2, "{out}");
        // Each device's predicted peak against its fullest rank's measured one: to the byte.
        assert!(rows.iter().all(|r| r.contains(" 0.0% ")), "{out}");
        assert!(out.contains("Spearman rank correlation"), "{out}");
    }
}

#[test]
fn a_shape_the_reference_gpt_lacks_is_refused_by_train_and_validate() {
    let tied = plan_args(&["--tied-embeddings"], &[]);
    let out = common::plan::ok(&tied);
    assert!(out.contains("(train refuses this line: "), "{out}");
    assert!(out.contains("plan without --tied-embeddings"), "{out}");
    let tied = plan_args(&["--tied-embeddings"], &["--validate", "2"]);
    common::plan::refused(&tied, &["--validate", "no tied embeddings"]);
    common::refused(
        &["train", "--steps", "1", "--tied-embeddings"],
        &["--tied-embeddings", "no tied embeddings"],
    );
    // A base without rotary positions, and rotary positions on heads of odd width.
    common::refused(
        &["train", "--steps", "1", "--rope-theta", "500000"],
        &["--rope-theta", "also give --positions rotary"],
    );
    common::refused(
        &[
            "train",
            "--steps",
            "1",
            "--positions",
            "rotary",
            "--d-model",
            "12",
            "--heads",
            "4",
        ],
        &["--positions rotary", "head width 3", "not even"],
    );
}
