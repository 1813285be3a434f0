//! Issue 32's CLI classes: a plan that one refused candidate used to end, shape sizes that
//! wrapped, absurd cluster and profile figures, readers given the wrong kind of file, and the
//! launch line's quoting.

mod common;

use common::plan::{ok, refused};

const LLAMA_8B: [&str; 8] = [
    "--layers",
    "32",
    "--d-model",
    "4096",
    "--heads",
    "32",
    "--gpus",
    "8",
];

/// Class 5: a candidate a check refuses (sequence parallelism over a sequence TP cannot split;
/// two chunks per device with fewer microbatches than devices) is dropped, not the plan.
#[test]
fn a_refused_candidate_is_dropped_not_the_plan() {
    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "1", "--global-batch", "64", "--explain"]);
    let out = ok(&args);
    assert!(out.contains("refused by a check and dropped"), "{out}");
    assert!(out.contains("tp (2) must divide seq_len (1)"), "{out}");
    assert!(out.contains("mpirun -np 8 pipewright train"), "{out}");

    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "3", "--tp", "1", "--global-batch", "64"]);
    assert!(ok(&args).contains("mpirun -np 8 pipewright train"));

    // A fixed flag under which every candidate is refused is named, with the reason.
    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "1", "--global-batch", "64"]);
    args.extend(["--tp", "2", "--sequence-parallel"]);
    refused(&args, &["--tp 2 fits no configuration", "must divide seq_len (1)"]);
}

/// Class 8: sizes whose counts pass a `u64` are refused naming the sizes, never planned from
/// a count that wrapped (a debug build panicked on the multiplication); a `head_dim` whose
/// product with the heads wraps back to `hidden_size` is refused, not taken as equal.
#[test]
fn shape_counts_that_would_wrap_are_refused() {
    let args = [
        "--layers", "4096", "--d-model", "1099511627776", "--heads", "1", "--seq-len", "1",
        "--vocab", "1", "--gpus", "8", "--global-batch", "8",
    ];
    refused(&args, &["pass 2^60", "--d-model 1099511627776"]);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    // 2^59 x 32 heads is 2^64: with 128 added per head, 4096 once wrapped.
    let head_dim = (1u64 << 59) + 128;
    std::fs::write(
        &config,
        format!(
            r#"{{"model_type": "llama", "num_attention_heads": 32, "hidden_size": 4096,
            "head_dim": {head_dim}, "num_hidden_layers": 2, "intermediate_size": 11008,
            "vocab_size": 32000, "max_position_embeddings": 4096}}"#
        ),
    )
    .unwrap();
    let path = config.to_str().unwrap();
    refused(
        &["--hf-config", path, "--gpus", "8", "--global-batch", "8"],
        &["head_dim", &head_dim.to_string()],
    );
}
