//! Mixture-of-experts shapes on the command line (issue 35): the flags of a mixture mean the
//! same on every command that takes a shape and are refused in the flags' words where they
//! contradict; a mixture (from flags or a config) is planned with its experts, simulated and
//! trained, its memory predicted as `train` measures it.

use crate::common;

const SHAPE: [&str; 10] = [
    "--layers",
    "4",
    "--d-model",
    "64",
    "--heads",
    "4",
    "--seq-len",
    "16",
    "--vocab",
    "64",
];

fn plan(extra: &[&str], needles: &[&str]) {
    let rest = [
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--cluster",
        "a100-80g",
    ];
    common::plan::refused(&[&SHAPE[..], extra, &rest].concat(), needles);
}

#[test]
fn contradicting_expert_flags_are_refused_naming_them() {
    plan(
        &["--experts", "4", "--top-k", "5"],
        &["--top-k 5 must be at most --experts 4"],
    );
    plan(
        &["--top-k", "2"],
        &["--top-k describes a mixture of experts: also give --experts"],
    );
    plan(&["--experts", "4"], &["--experts needs --top-k"]);
    plan(
        &["--experts", "4", "--top-k", "1", "--shared-ffn", "32"],
        &["--shared-ffn is the width of a shared expert: also give --shared-experts"],
    );
    plan(
        &["--experts", "4", "--top-k", "1", "--dense-layers", "4"],
        &["--dense-layers 4 and --moe-every 1 leave none of the --layers 4 an MoE layer"],
    );
}

#[test]
fn a_mixture_is_planned_and_simulated_and_a_layout_that_does_not_fit_is_refused() {
    let moe = ["--experts", "4", "--top-k", "2", "--shared-experts", "1"];
    let rest = [
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--cluster",
        "a100-80g",
    ];
    let out = common::plan::ok(&[&SHAPE[..], &moe, &rest].concat());
    // The header gives both counts; a dense model's gives one.
    assert!(
        out.lines()
            .next()
            .unwrap()
            .contains("B parameters, 0.00B active)"),
        "{out}"
    );
    let dense = common::plan::ok(&[&SHAPE[..], &rest].concat());
    assert!(!dense.contains("active"), "{dense}");
    let deepseek = deepseek();
    let fixed = [
        "--tp",
        "1",
        "--pp",
        "16",
        "--ep",
        "32",
        "--microbatch-size",
        "1",
        "--recompute",
        "full",
        "--zero",
        "1",
        "--seq-len",
        "1024",
    ];
    let args = [
        "--hf-config",
        &deepseek,
        "--gpus",
        "512",
        "--global-batch",
        "64",
    ];
    let out = common::plan::ok(&[&args[..], &fixed, &["--cluster", "h100-80g"]].concat());
    assert!(out.contains("671.03B parameters, 37.55B active"), "{out}");
    assert!(out.contains(" ep 32"), "{out}");
    // A fixed layout that does not fit the model is refused naming the flag.
    common::plan::refused(
        &[&SHAPE[..], &moe, &rest, &["--ep", "3"]].concat(),
        &["--ep 3 must divide the model's 4 routed experts"],
    );
    common::plan::refused(
        &[&SHAPE[..], &rest, &["--ep", "2"]].concat(),
        &["--ep applies to a mixture of experts"],
    );
    common::plan::refused(
        &[&SHAPE[..], &rest, &["--dispatcher", "deepep"]].concat(),
        &["--dispatcher applies to a mixture of experts"],
    );
    // DeepEP's dispatch crosses to a node once a token, not once an expert: the same layout
    // moves less over InfiniBand, and the launch line says the runtime does not do it.
    let all_to_all = |extra: &[&str]| -> (f64, String) {
        let h100 = ["--cluster", "h100-80g", "--explain"];
        let out = common::plan::ok(&[&args[..], &fixed, &h100, extra].concat());
        let s = out
            .split("expert all-to-all: ")
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"));
        (s.split(' ').next().unwrap().parse().unwrap(), out)
    };
    let (plain, _) = all_to_all(&[]);
    let (deep, out) = all_to_all(&["--dispatcher", "deepep"]);
    assert!(deep < 0.9 * plain, "{deep} vs {plain}");
    assert!(
        out.contains("dispatches by a plain all-to-all, not DeepEP's"),
        "{out}"
    );
    // FP8 GEMMs, and DeepSeek's node-limited routing from its config (a token's experts from
    // 4 of 8 groups, one a node): a shorter step, said in the heading and under the launch.
    let (_, fp8) = all_to_all(&["--dispatcher", "deepep", "--fp8"]);
    assert!(fp8.contains("top 8, from 4 of 8 groups"), "{fp8}");
    assert!(fp8.contains("bf16 with FP8 GEMMs"), "{fp8}");
    assert!(fp8.contains("computes in bf16, not FP8"), "{fp8}");
    common::plan::refused(
        &[&args[..], &fixed, &["--fp8"]].concat(),
        &["--fp8 on --cluster a100-80g: the cluster has no FP8 peak"],
    );
    common::plan::refused(
        &[&SHAPE[..], &moe, &rest, &["--expert-groups", "2"]].concat(),
        &["--expert-groups needs --groups-per-token"],
    );
    // Where --fp8 or the groups would be ignored, they are refused.
    for extra in [&["--fp8"][..], &["--expert-groups", "2"]] {
        let flag = extra[0];
        common::plan::refused(
            &[&["--calibrate", "c.json"][..], extra].concat(),
            &[&format!(
                "--calibrate measures this machine and plans nothing: {flag} does not apply"
            )],
        );
    }
    let small = [
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--cluster",
        "h100-80g",
    ];
    common::plan::refused(
        &[
            &SHAPE[..],
            &small,
            &["--bias", "none", "--fp8", "--validate", "2"],
        ]
        .concat(),
        &["--validate trains in bf16 on this machine, so it cannot check --fp8's times"],
    );
    common::plan::refused(
        &[&SHAPE[..], &moe, &rest, &["--capacity-factor", "0.5"]].concat(),
        &["--capacity-factor 0.5: must be a finite number at least 1"],
    );
    // The mixture's flags beside a config, which gives the shape, are refused.
    common::plan::refused(
        &[&args[..], &["--experts", "8"]].concat(),
        &["leave out --experts"],
    );
    let simulate = [
        &["simulate", "--stages", "2", "--microbatch-size", "1"][..],
        &SHAPE,
        &moe,
    ]
    .concat();
    // simulate's memory model counts the reference GPT's mixture.
    let out = common::ok(&simulate);
    assert!(out.contains("predicted memory per rank"), "{out}");
    let train = [&["train", "--steps", "1"][..], &SHAPE, &moe].concat();
    common::refused(
        &train,
        &["--experts: model: a mixture's experts have no biases, so the other layers cannot have them (bias all)"],
    );
    let grouped = [
        "--bias",
        "none",
        "--expert-groups",
        "2",
        "--groups-per-token",
        "1",
    ];
    common::refused(
        &[&train[..], &grouped].concat(),
        &["the reference GPT's mixture of experts has no group-limited routing"],
    );
    // A layer profile is its own model: the mixture's flags beside it are clap's error.
    let o = common::plan::run(&["--profile", "p.json", "--experts", "4", "--gpus", "1"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `train --ep` is checked before any work, in the flags' words.
#[test]
fn train_refuses_an_expert_degree_naming_ep() {
    let moe = ["--experts", "4", "--top-k", "2", "--bias", "none"];
    let head = ["train", "--steps", "1", "--stages", "2", "--dp", "2"];
    let three = [&head[..], &SHAPE, &moe, &["--ep", "3"]].concat();
    common::refused(&three, &["--ep 3: must divide the 4 experts"]);
    let dense = [&head[..], &SHAPE, &["--ep", "2"]].concat();
    common::refused(
        &dense,
        &["--ep 2: shards the experts of a mixture; the model has none"],
    );
    let eight = [
        "--experts",
        "8",
        "--top-k",
        "2",
        "--bias",
        "none",
        "--ep",
        "4",
    ];
    let folded = [&head[..], &SHAPE, &eight].concat();
    common::refused(&folded, &["--ep 4: must divide dp = 2"]);
}

/// Mixture A of the runtime's memory tests: GeLU, 4 experts of width 16, top-2, a shared
/// expert of width 8, the first of 4 blocks dense, no biases; 2 stages of 4 microbatches of 2.
const MIXTURE: [&str; 28] = [
    "--layers",
    "4",
    "--d-model",
    "16",
    "--heads",
    "4",
    "--seq-len",
    "8",
    "--vocab",
    "32",
    "--experts",
    "4",
    "--top-k",
    "2",
    "--expert-ffn",
    "16",
    "--shared-experts",
    "1",
    "--shared-ffn",
    "8",
    "--dense-layers",
    "1",
    "--bias",
    "none",
    "--stages",
    "2",
    "--microbatch-size",
    "2",
];

/// The last JSON step of `train --format json --steps 2` with `extra`: its loss and each
/// rank's peak memory.
fn train_moe(extra: &[&str]) -> (f64, Vec<serde_json::Value>) {
    let head = ["train", "--format", "json", "--steps", "2"];
    let out = common::ok(&[&head[..], &MIXTURE, extra].concat());
    let step: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 1, "{out}");
    let memory = step["memory"].as_array().unwrap();
    let peaks = memory.iter().map(|r| r["peak"].clone()).collect();
    (step["loss"].as_f64().unwrap(), peaks)
}

/// A mixture trains end to end (its memory check passes) at pp 2 and pp 2 x dp 2 x ep 2;
/// at pp 2 each rank's measured peak is `simulate`'s prediction to the byte, and EP 2 halves
/// each rank's experts: 2048 expert parameters an MoE layer, one on stage 0, two on stage 1.
#[test]
fn a_mixture_trains_and_its_memory_is_the_prediction() {
    let (loss, peaks) = train_moe(&[]);
    assert!(loss.is_finite(), "{loss}");
    let sim = common::ok(&[&["simulate", "--format", "json"][..], &MIXTURE].concat());
    let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
    assert_eq!(
        sim["predicted_memory"].as_array().unwrap(),
        &peaks,
        "predicted vs measured"
    );
    let (loss, ep) = train_moe(&["--dp", "2", "--ep", "2"]);
    assert!(loss.is_finite(), "{loss}");
    assert_eq!(ep.len(), 4);
    for (rank, m) in ep.iter().enumerate() {
        let d = rank / 2;
        let moe_layers = [1, 2][d];
        let want = peaks[d]["parameters"].as_u64().unwrap() - 4 * 1024 * moe_layers;
        assert_eq!(m["parameters"].as_u64(), Some(want), "rank {rank}");
        assert_eq!(m["gradients"].as_u64(), Some(want), "rank {rank}");
        assert_eq!(m["optimizer_state"].as_u64(), Some(2 * want), "rank {rank}");
    }
}

/// `plan --costs-out` hands the best's predicted costs, all-to-all included, to `simulate`:
/// the file's DualPipeV step moves the plan's all-to-all (per device, times the devices) and
/// hides part of it in its F&B pairs, and 1F1B on the same file hides none.
#[test]
fn a_plans_costs_carry_the_all_to_all_into_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let costs = dir.path().join("costs.json");
    let (deepseek, costs_arg) = (deepseek(), costs.to_str().unwrap());
    let layout = [
        "--gpus",
        "512",
        "--global-batch",
        "1024",
        "--seq-len",
        "1024",
    ];
    let fixed = [
        "--tp",
        "1",
        "--pp",
        "16",
        "--ep",
        "32",
        "--microbatch-size",
        "1",
    ];
    let rest = [
        "--schedule",
        "dualpipev",
        "--explain",
        "--costs-out",
        costs_arg,
    ];
    let head = ["--hf-config", &deepseek, "--cluster", "h100-80g"];
    let out = common::plan::ok(&[&head[..], &layout, &fixed, &rest].concat());
    assert!(out.contains("dualpipev v 2 mbs 1 m 32"), "{out}");
    let per_device: f64 = out
        .split("expert all-to-all: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let simulate = |schedule: &str, v: &str| {
        common::ok(&[
            "simulate",
            "--schedule",
            schedule,
            "--stages",
            "16",
            "--virtual",
            v,
            "--microbatches",
            "32",
            "--cost-file",
            costs_arg,
        ])
    };
    let comm = |out: &str| -> (f64, f64) {
        let line = out
            .lines()
            .find(|l| l.starts_with("communication in actions"));
        let nums: Vec<f64> = line
            .unwrap_or_else(|| panic!("{out}"))
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|s| s.parse().ok())
            .collect();
        (nums[0], nums[1])
    };
    let (total, hidden) = comm(&simulate("dualpipev", "2"));
    assert!(
        (total - 16.0 * per_device).abs() < 0.01 * total,
        "{total} vs 16 x {per_device}"
    );
    assert!(hidden > 0.2 * total, "{hidden} of {total}");
    // Sequential actions pay the same all-to-all in full.
    let (total_1f1b, hidden_1f1b) = comm(&simulate("1f1b", "1"));
    assert!(
        (total_1f1b - total).abs() < 1e-6 * total,
        "{total_1f1b} vs {total}"
    );
    assert_eq!(hidden_1f1b, 0.0);
}

/// DeepSeek-V3's config.json, as the tests read it.
fn deepseek() -> String {
    format!(
        "{}/../model/tests/fixtures/hf/deepseek-v3.json",
        env!("CARGO_MANIFEST_DIR")
    )
}
