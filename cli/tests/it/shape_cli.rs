//! Model shapes on the command line (issue 26): `plan --hf-config` plans a Hugging Face
//! config.json and prints its parameter count; the shape-kind flags and `--attention` mean
//! the same on `plan`, `simulate` and `search`; bad configs and bad kinds are refused in one
//! line naming the file, the field or the flag.

use serde_json::Value;

use crate::common;

fn fixture(name: &str) -> String {
    format!(
        "{}/../model/tests/fixtures/hf/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn plan_reads_a_config_json_prints_its_parameters_and_launches_its_shape() {
    let llama = fixture("llama3-8b.json");
    let args = [
        "--hf-config",
        &llama,
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--cluster",
        "h100-80g",
        "--top",
        "2",
    ];
    let o = common::plan::run(&args);
    let out = common::succeeded(&o, &args);
    // Where the sequence came from is said on stderr.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sequence 8192 from its max_position_embeddings (--seq-len plans another)"),
        "{err}"
    );
    let first = out.lines().next().unwrap_or_default();
    assert!(first.contains("(8.03B parameters)"), "{first}");
    assert!(
        first.contains("32 heads (8 kv), swiglu 14336, rmsnorm, rotary"),
        "{first}"
    );
    assert!(
        first.contains("seq 8192") && first.contains("fused attention"),
        "{first}"
    );
    let launch = out
        .lines()
        .find(|l| l.trim_start().starts_with("mpirun -np 64 pipewright train"))
        .unwrap_or_else(|| panic!("no launch line in {out}"));
    assert!(
        launch.ends_with(
            "--seq-len 8192 --vocab 128256 --ffn 14336 --kv-heads 8 --mlp swiglu --norm rmsnorm --positions rotary --rope-theta 500000 --bias none"
        ),
        "{launch}"
    );
    // JSON names every field of the shape, its count and the run's attention.
    let json: Value = serde_json::from_str(&common::plan::ok(
        &[&args[..], &["--format", "json"]].concat(),
    ))
    .unwrap();
    assert_eq!(json["model"]["parameters"], 8_030_261_248u64);
    assert_eq!(json["model"]["kv_heads"], 8);
    assert_eq!(json["model"]["mlp"], "swiglu");
    assert_eq!(json["model"]["rope_theta"], 500_000.0);
    assert_eq!(json["attention"], "fused");
    // --seq-len replaces the config's; --attention the cluster's.
    let short = common::plan::ok(
        &[
            &args[..],
            &["--seq-len", "2048", "--attention", "materialized"],
        ]
        .concat(),
    );
    let first = short.lines().next().unwrap_or_default();
    assert!(
        first.contains("seq 2048") && first.contains("materialized attention"),
        "{first}"
    );
}

#[test]
fn the_kind_flags_build_the_same_shape_as_the_config() {
    // Llama 3 8B by flags: the same count as from its config.json.
    let out = common::plan::ok(&[
        "--layers",
        "32",
        "--d-model",
        "4096",
        "--heads",
        "32",
        "--kv-heads",
        "8",
        "--ffn",
        "14336",
        "--mlp",
        "swiglu",
        "--norm",
        "rmsnorm",
        "--positions",
        "rotary",
        "--bias",
        "none",
        "--seq-len",
        "8192",
        "--vocab",
        "128256",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--top",
        "1",
    ]);
    assert!(
        out.lines()
            .next()
            .unwrap_or_default()
            .contains("(8.03B parameters)"),
        "{out}"
    );
}

#[test]
fn bad_configs_and_kinds_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, r#"{"model_type": "llama", "hidden_size": 4096}"#).unwrap();
    let bad = bad.to_str().unwrap();
    let common = ["--gpus", "8", "--global-batch", "8"];
    common::plan::refused(
        &[&["--hf-config", bad][..], &common].concat(),
        &[
            bad,
            "field `num_attention_heads` is missing (llama needs it)",
        ],
    );
    common::plan::refused(
        &[&["--hf-config", "/nonexistent/config.json"][..], &common].concat(),
        &["/nonexistent/config.json"],
    );
    // A config gives the shape: shape flags beside it are refused by clap.
    let llama = fixture("llama3-8b.json");
    let o = common::plan::run(&[&["--hf-config", &llama, "--layers", "4"][..], &common].concat());
    assert_eq!(o.status.code(), Some(2));
    let shape = [
        "--layers",
        "2",
        "--d-model",
        "64",
        "--heads",
        "4",
        "--seq-len",
        "16",
        "--gpus",
        "1",
        "--global-batch",
        "1",
    ];
    common::plan::refused(
        &[&shape[..], &["--kv-heads", "3"]].concat(),
        &["--kv-heads 3 must divide --heads 4"],
    );
    let o = common::plan::run(&[&shape[..], &["--mlp", "relu"]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gelu, swiglu, geglu"));
}

#[test]
fn simulate_predicts_a_config_jsons_memory_under_either_attention() {
    let llama = fixture("llama3-8b.json");
    let run = |attention: &str| -> u64 {
        let out = common::ok(&[
            "simulate",
            "--stages",
            "4",
            "--format",
            "json",
            "--hf-config",
            &llama,
            "--seq-len",
            "4096",
            "--microbatch-size",
            "1",
            "--tp",
            "8",
            "--precision",
            "bf16",
            "--accounting",
            "megatron",
            "--attention",
            attention,
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["predicted_memory"][0]["activations"].as_u64().unwrap()
    };
    let (fused, materialized) = (run("fused"), run("materialized"));
    // The scores (5 bytes x 32 heads x 4096 positions / tp 8, 81,920 a token) more than
    // double a materialized layer (54,272 a token besides them); fused keeps a logsumexp.
    assert!(materialized > 2 * fused, "{materialized} vs {fused}");
    // The reference GPT's exact accounting takes grouped-query attention, SwiGLU, RMSNorm
    // and Llama's rotary positions (they change no stash: the turned queries and keys are
    // kept in place of the projection's output).
    let out = common::ok(&[
        "simulate",
        "--stages",
        "2",
        "--format",
        "json",
        "--hf-config",
        &llama,
        "--seq-len",
        "512",
        "--microbatch-size",
        "1",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["predicted_memory"][0]["activations"].as_u64().unwrap() > 0,
        "{out}"
    );
    // A tied Llama is not the reference GPT: refused, naming the tie.
    let dir = tempfile::tempdir().unwrap();
    let tied = dir.path().join("tied.json");
    let text = std::fs::read_to_string(&llama).unwrap();
    let text = text.replace(
        "\"tie_word_embeddings\": false",
        "\"tie_word_embeddings\": true",
    );
    std::fs::write(&tied, text).unwrap();
    common::refused(
        &[
            "simulate",
            "--stages",
            "2",
            "--hf-config",
            tied.to_str().unwrap(),
        ],
        &["pipewright accounting", "no tied embeddings"],
    );
}
