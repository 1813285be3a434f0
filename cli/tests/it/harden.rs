//! Issue 32's CLI classes: a plan that one refused candidate used to end, shape sizes that
//! wrapped, absurd cluster and profile figures, readers given the wrong kind of file, and the
//! launch line's quoting.

use crate::common;

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
    refused(
        &args,
        &["--tp 2 fits no configuration", "must divide seq_len (1)"],
    );
}

/// Class 8: sizes whose counts pass a `u64` are refused naming the sizes, never planned from
/// a count that wrapped (a debug build panicked on the multiplication); a `head_dim` whose
/// product with the heads wraps back to `hidden_size` is refused, not taken as equal.
#[test]
fn shape_counts_that_would_wrap_are_refused() {
    let args = [
        "--layers",
        "4096",
        "--d-model",
        "1099511627776",
        "--heads",
        "1",
        "--seq-len",
        "1",
        "--vocab",
        "1",
        "--gpus",
        "8",
        "--global-batch",
        "8",
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

/// A100-like cluster file text with `memory_gib` and the bf16 peak as given.
fn cluster_text(memory_gib: &str, bf16: &str) -> String {
    format!(
        r#"{{ "name": "odd", "gpus_per_node": 8, "memory_gib": {memory_gib},
             "peak_tflops": {{ "bf16": {bf16}, "tf32": 156, "f32": 19.5 }},
             "memory_bandwidth_gbs": 2039,
             "intra_node": {{ "bandwidth_gbs": 240, "latency_us": 5 }},
             "inter_node": {{ "bandwidth_gbs": 23, "latency_us": 10 }} }}"#
    )
}

const SMALL: [&str; 12] = [
    "--layers",
    "8",
    "--d-model",
    "1024",
    "--heads",
    "8",
    "--seq-len",
    "1024",
    "--gpus",
    "8",
    "--global-batch",
    "16",
];

/// Class 7: cluster and profile figures no device can have are refused naming the field and
/// the file, not planned into -0.0% headroom, 2^64 more GPUs or 300-digit step times.
#[test]
fn absurd_cluster_and_profile_figures_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            cluster_text("85899345920", "312"),
            "memory_gib is 85899345920",
        ),
        (cluster_text("1e-12", "312"), "memory_gib is 0.000000000001"),
        (cluster_text("80", "1e300"), "peak_tflops.bf16 is 1000000"),
        (cluster_text("80", "1e-300"), "peak_tflops.bf16 is 0.000"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("cluster{i}.json"));
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        let mut args = SMALL.to_vec();
        args.extend(["--cluster", path]);
        refused(&args, &[path, needle, "outside"]);
    }
    // A sane file plans.
    let path = dir.path().join("sane.json");
    std::fs::write(&path, cluster_text("80", "312")).unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--cluster", path.to_str().unwrap()]);
    ok(&args);

    let profile = dir.path().join("profile.json");
    std::fs::write(
        &profile,
        r#"{"version": 1, "microbatch_size": 1, "layers": [
            {"f_ms": 1e-300, "i_ms": 1, "w_ms": 1, "params": 10, "param_bytes": 40,
             "stash_bytes": 8, "weight_stash_bytes": 8, "output_bytes": 8},
            {"f_ms": 1, "i_ms": 1, "w_ms": 1, "params": 10, "param_bytes": 40,
             "stash_bytes": 8, "weight_stash_bytes": 8, "output_bytes": 8}]}"#,
    )
    .unwrap();
    let profile = profile.to_str().unwrap();
    refused(
        &["--profile", profile, "--gpus", "2", "--global-batch", "4"],
        &[profile, "layer 0: f_ms must be 0 or from"],
    );
}

/// Class 12: `--cluster`, `--profile` and `--hf-config` given another kind of pipewright
/// file say what it is and what they wanted.
#[test]
fn a_reader_given_another_kind_of_file_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let costs = write("costs.json", r#"{"default": {"f": 1, "b": 2}}"#);
    let timeline = write("timeline.json", r#"{"events": [], "meta": {}}"#);
    let hf = write(
        "config.json",
        r#"{"model_type": "llama", "num_attention_heads": 32, "hidden_size": 4096}"#,
    );
    let cluster = write("cluster.json", &cluster_text("80", "312"));
    let mut args = SMALL.to_vec();
    args.extend(["--cluster", &costs]);
    refused(&args, &["is a cost file", "not a cluster file"]);
    let mut args = SMALL.to_vec();
    args.extend(["--cluster", &hf]);
    refused(&args, &["is a Hugging Face config", "not a cluster file"]);
    refused(
        &["--profile", &timeline, "--gpus", "2", "--global-batch", "4"],
        &["is a timeline", "not a layer profile"],
    );
    refused(
        &["--profile", &cluster, "--gpus", "2", "--global-batch", "4"],
        &["is a cluster file", "not a layer profile"],
    );
    refused(
        &[
            "--hf-config",
            &cluster,
            "--gpus",
            "2",
            "--global-batch",
            "4",
        ],
        &["is a cluster file", "not a Hugging Face config.json"],
    );
}

/// Class 11: the launch line quotes a timetable path with a space, so it runs as printed
/// (the searched best of `plan_searched_cli.rs`'s small GPT on a slow-link cluster).
#[test]
fn the_launch_line_quotes_a_timetable_path_with_spaces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("my runs")).unwrap();
    let cluster = d.join("c.json");
    std::fs::write(
        &cluster,
        r#"{ "name": "small", "gpus_per_node": 8, "memory_gib": 0.05,
             "peak_tflops": { "bf16": 100, "tf32": 50, "f32": 10 },
             "memory_bandwidth_gbs": 900,
             "intra_node": { "bandwidth_gbs": 50, "latency_us": 5 },
             "inter_node": { "bandwidth_gbs": 10, "latency_us": 10 } }"#,
    )
    .unwrap();
    let args = [
        "plan",
        "--cluster",
        cluster.to_str().unwrap(),
        "--layers",
        "8",
        "--d-model",
        "64",
        "--heads",
        "2",
        "--seq-len",
        "16",
        "--vocab",
        "64",
        "--gpus",
        "4",
        "--global-batch",
        "16",
        "--tp",
        "1",
        "--pp",
        "4",
        "--microbatch-size",
        "1",
        "--precision",
        "f32",
        "--timetable-out",
        "my runs/best.csv",
    ];
    let out = common::ok_in(Some(d), &args);
    assert!(out.contains(" --timetable 'my runs/best.csv' "), "{out}");
    assert!(d.join("my runs/best.csv").exists());
}

/// Class 11: a timeline with events before 0 is refused (its bubble would count time nothing
/// ran in), and an `rope_scaling` that is not an object is refused, not ignored.
#[test]
fn a_timeline_before_zero_and_a_rope_scaling_of_another_form_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    common::ok_in(
        Some(d),
        &[
            "simulate",
            "--schedule",
            "1f1b",
            "--stages",
            "2",
            "--microbatches",
            "2",
            "--timeline",
            "tl.json",
        ],
    );
    let mut tl: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("tl.json")).unwrap()).unwrap();
    for e in tl["events"].as_array_mut().unwrap() {
        for k in ["start", "end"] {
            e[k] = serde_json::json!(e[k].as_f64().unwrap() - 5.0);
        }
    }
    std::fs::write(d.join("neg.json"), tl.to_string()).unwrap();
    common::refused_in(
        Some(d),
        &["viz", "--from", "neg.json", "-o", "x.svg"],
        Some(1),
        &["neg.json", "starts at -5, before the step's start at 0"],
    );

    std::fs::write(
        d.join("config.json"),
        r#"{"model_type": "llama", "num_attention_heads": 32, "hidden_size": 4096,
            "num_hidden_layers": 2, "intermediate_size": 11008, "vocab_size": 32000,
            "max_position_embeddings": 4096, "rope_scaling": "linear"}"#,
    )
    .unwrap();
    common::refused_in(
        Some(d),
        &[
            "plan",
            "--hf-config",
            "config.json",
            "--gpus",
            "8",
            "--global-batch",
            "8",
        ],
        Some(1),
        &["rope_scaling", "\"linear\"", "an object"],
    );
}
