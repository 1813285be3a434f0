//! `plan` on today's shapes end to end: the launch line of a small model in each new shape
//! (grouped-query attention with SwiGLU and RMSNorm, multi-query attention with GeGLU)
//! trains that very shape (run in-process in place of over NCCL), `plan --validate` measures
//! it against the memory model's prediction, and a shape the reference GPT lacks is refused in
//! one line.

mod common;

/// A small Llama-shaped model (2 key/value heads of 4, SwiGLU of width 48, RMSNorm, no
/// biases), fixed to TP 2 with sequence parallelism (one key/value head a rank), and a
/// multi-query GeGLU one with a QKV bias, on 2 CPU "GPUs".
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

#[test]
fn the_launch_line_trains_the_planned_shape() {
    for kinds in SHAPES {
        let out = common::plan::ok(&plan_args(kinds, &[]));
        let launch = out
            .lines()
            .find(|l| l.trim_start().starts_with("mpirun -np 2 pipewright train"))
            .unwrap_or_else(|| panic!("no launch line in {out}"));
        // Every kind of the plan's shape (and its fixed TP) is on the line.
        for flag in kinds.iter().filter(|w| w.starts_with("--")) {
            assert!(launch.contains(flag), "{flag} not in {launch}");
        }
        // The line itself, in-process instead of one process per GPU over NCCL.
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
    let rotary = plan_args(&["--positions", "rotary"], &[]);
    let out = common::plan::ok(&rotary);
    assert!(out.contains("(train refuses this line: "), "{out}");
    let rotary = plan_args(&["--positions", "rotary"], &["--validate", "2"]);
    common::plan::refused(&rotary, &["--validate", "no rotary positions"]);
    common::refused(
        &["train", "--steps", "1", "--tied-embeddings"],
        &["--tied-embeddings", "no tied embeddings"],
    );
}
