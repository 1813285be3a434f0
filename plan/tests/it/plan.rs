//! The plan's contract: what it ranks fits, respects what the user fixed, is ordered by the
//! simulator's step time, and a request nothing satisfies gets one line naming what would.

use pipewright_model::memory::ModelShape;
use pipewright_plan::costs::cost_model;
use pipewright_plan::{evaluate, plan, Cluster, Fixed, PlanError, PlanRequest};
use pipewright_schedule::{Recompute, ScheduleKind};

fn gpt(layers: u32, d_model: u64, heads: u32, seq_len: u64) -> ModelShape {
    ModelShape::gpt(layers, d_model, heads, 4 * d_model, seq_len, 51200)
}

fn a100(shape: ModelShape, gpus: u32, batch: u64) -> PlanRequest {
    PlanRequest::new(shape, Cluster::preset("a100-80g").unwrap(), gpus, batch)
}

fn impossible(req: &PlanRequest) -> String {
    match plan(req, &mut |_| {}) {
        Err(PlanError::Impossible(line)) => {
            let line = line.to_string();
            assert!(!line.contains('\n'), "one line: {line}");
            line
        }
        other => panic!("expected impossible, got {other:?}"),
    }
}

#[test]
fn rows_fit_are_ranked_and_are_what_the_simulator_says() {
    let req = a100(gpt(32, 4096, 32, 2048), 64, 512);
    let p = plan(&req, &mut |_| {}).unwrap();
    assert!(!p.rows.is_empty());
    for w in p.rows.windows(2) {
        assert!(w[0].step_time_s <= w[1].step_time_s);
    }
    for r in &p.rows {
        let c = r.config;
        assert_eq!(c.gpus(), 64);
        assert_eq!(
            u64::from(c.dp) * c.microbatch_size * u64::from(c.microbatches),
            512
        );
        assert_eq!(32 % c.tp, 0, "tp divides the heads");
        assert!(c.tp <= 8, "tp stays in a node");
        assert!(r.headroom_bytes >= 0 && r.peak_memory_bytes <= req.cluster.memory_bytes());
        // The row's time is the simulator's, and no lower than its own bound.
        let (costs, _) = cost_model(&req, &c);
        let simulated = match &r.searched {
            Some(s) => pipewright_plan::listed::period(&s.timetable, &costs).unwrap(),
            None => evaluate::step_time(&c, &costs).unwrap(),
        };
        assert_eq!(simulated, r.step_time_s);
        assert!(r.bound_s <= r.step_time_s * 1.02);
        let t = r.terms.unwrap();
        assert!(
            (t.total() / r.step_time_s - 1.0).abs() < 1e-6,
            "{t:?} vs {}",
            r.step_time_s
        );
        let mfu = r.mfu.expect("a GPT has FLOPs");
        assert!(mfu > 0.0 && mfu < 1.0);
    }
}

#[test]
fn fixed_dimensions_are_kept() {
    let mut req = a100(gpt(32, 4096, 32, 2048), 64, 512);
    req.fixed = Fixed {
        tp: Some(4),
        pp: Some(4),
        microbatch_size: Some(1),
        schedule: Some(ScheduleKind::Interleaved1F1B),
        v: Some(2),
        recompute: Some(Recompute::Full),
        zero: Some(1),
        sequence_parallel: Some(true),
        ..Fixed::default()
    };
    let p = plan(&req, &mut |_| {}).unwrap();
    assert_eq!(p.rows.len(), 1);
    let c = p.rows[0].config;
    assert_eq!(
        (c.tp, c.pp, c.dp, c.v, c.microbatch_size, c.microbatches),
        (4, 4, 4, 2, 1, 128)
    );
    assert_eq!(c.schedule, ScheduleKind::Interleaved1F1B);
    assert_eq!(
        (c.recompute, c.zero, c.sequence_parallel),
        (Recompute::Full, 1, true)
    );
}

#[test]
fn more_recomputation_never_makes_the_same_configuration_faster() {
    let mut req = a100(gpt(32, 4096, 32, 2048), 64, 512);
    let mut fixed = Fixed {
        tp: Some(2),
        pp: Some(4),
        microbatch_size: Some(1),
        schedule: Some(ScheduleKind::OneFOneB),
        zero: Some(1),
        sequence_parallel: Some(true),
        ..Fixed::default()
    };
    let mut times = Vec::new();
    for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
        fixed.recompute = Some(r);
        req.fixed = fixed.clone();
        times.push(plan(&req, &mut |_| {}).unwrap().rows[0].step_time_s);
    }
    assert!(times[0] <= times[1] && times[1] < times[2], "{times:?}");
}

#[test]
fn recomputation_goes_only_to_the_first_devices_that_need_it_and_is_faster_there() {
    // 1F1B at pp 8 without SP: only device 0 (8 microbatches of 4 in flight) needs it.
    let mut req = a100(gpt(48, 8192, 64, 2048), 64, 512);
    req.fixed = Fixed {
        tp: Some(8),
        pp: Some(8),
        microbatch_size: Some(4),
        schedule: Some(ScheduleKind::OneFOneB),
        sequence_parallel: Some(false),
        ..Fixed::default()
    };
    let p = plan(&req, &mut |_| {}).unwrap();
    let some = p
        .rows
        .iter()
        .find(|r| r.config.recompute_devices < r.config.pp)
        .expect("a row recomputing on some devices only");
    let c = some.config;
    assert_eq!(
        (c.recompute_devices, c.recompute),
        (1, Recompute::Selective)
    );
    assert!(
        c.to_string().contains("recompute selective on dev 0 "),
        "{c}"
    );
    // Only device 0's stage recomputes, as `train --recompute` is told.
    assert_eq!(c.recompute_plan().to_string(), "0:selective");
    assert!(some.peak_memory_bytes <= req.cluster.memory_bytes());
    // Without recomputation it does not fit; everywhere, it is slower.
    let everywhere = p
        .rows
        .iter()
        .find(|r| {
            let o = r.config;
            o.recompute == Recompute::Selective
                && o.recompute_devices == 8
                && (o.sequence_parallel, o.zero) == (c.sequence_parallel, c.zero)
        })
        .expect("the uniform policy ranked too");
    assert!(some.step_time_s < everywhere.step_time_s);
    assert!(!p.rows.iter().any(|r| {
        let o = r.config;
        o.recompute == Recompute::None
            && (o.sequence_parallel, o.zero) == (c.sequence_parallel, c.zero)
    }));
}

#[test]
fn an_enormous_batch_is_refused_at_once() {
    for batch in [u64::MAX, (1 << 30) + 1] {
        let line = impossible(&a100(gpt(8, 256, 8, 128), 8, batch));
        assert!(
            line.contains("at most 1073741824 (2^30) sequences"),
            "{line}"
        );
    }
}

#[test]
fn heads_no_tp_divides_are_named_with_the_sizes_that_do() {
    let mut req = a100(gpt(4, 448, 7, 128), 8, 64);
    req.fixed.tp = Some(2);
    let line = impossible(&req);
    assert!(
        line.contains("--tp 2") && line.contains("7 heads"),
        "{line}"
    );
    assert!(line.contains("TP sizes that can: 1"), "{line}");
}

#[test]
fn a_batch_no_microbatching_divides_gets_the_nearest_that_does() {
    // 4 layers: pp <= 4 and tp <= 8, so dp >= 2 of 64 GPUs, which 7 sequences cannot fill.
    let req = a100(gpt(4, 512, 8, 128), 64, 7);
    let line = impossible(&req);
    assert!(line.contains("global batch 7"), "{line}");
    assert!(line.contains("nearest batch that works: 6 or 8"), "{line}");
    // And the nearest really works.
    assert!(plan(&a100(gpt(4, 512, 8, 128), 64, 8), &mut |_| {}).is_ok());
}

#[test]
fn a_model_too_large_for_the_gpus_says_how_many_more_it_needs() {
    let req = a100(gpt(128, 25600, 160, 2048), 64, 64);
    let line = impossible(&req);
    // 1T parameters at 18 bytes each (bf16 mixed precision, no ZeRO): 16.5 TiB, over 80 GiB.
    assert!(line.starts_with("needs 16.5 TiB of model state"), "{line}");
    assert!(line.contains("at least 148 more 80 GiB GPUs"), "{line}");
}

#[test]
fn activations_that_do_not_fit_name_the_lever_left_off() {
    let mut req = a100(gpt(128, 25600, 160, 2048), 512, 512);
    req.fixed.recompute = Some(Recompute::None);
    let line = impossible(&req);
    assert!(line.contains("activations do not"), "{line}");
    assert!(line.contains("--recompute full"), "{line}");
}

#[test]
fn a_fixed_dimension_that_rules_everything_out_is_named() {
    let mut req = a100(gpt(4, 512, 8, 128), 8, 64);
    req.fixed.pp = Some(3);
    let line = impossible(&req);
    assert!(line.starts_with("--pp 3 fits no configuration"), "{line}");
}

#[test]
fn cross_node_tp_is_only_tried_when_allowed() {
    let mut req = a100(gpt(8, 4096, 32, 512), 32, 32);
    req.fixed.tp = Some(16);
    assert!(impossible(&req).contains("inside a node of 8"));
    req.allow_cross_node_tp = true;
    let p = plan(&req, &mut |_| {}).unwrap();
    assert_eq!(p.rows[0].config.tp, 16);
}

/// A mixture of experts is planned with its experts, not as a dense model of its attention
/// and dense MLP: every rank holds all 8 experts (ep 1), and each token runs 2 of them.
#[test]
fn a_mixture_of_experts_is_planned_with_its_experts() {
    use pipewright_model::shape::MoeShape;
    let dense = gpt(8, 1024, 16, 1024);
    let moe = ModelShape {
        moe: Some(MoeShape {
            route_groups: None,
            experts: 8,
            top_k: 2,
            expert_ffn: 4096,
            shared_experts: 0,
            shared_ffn: 0,
            shared_gate: false,
            router_bias: false,
            dense_layers: 0,
            every: 1,
        }),
        ..dense
    };
    let best = |shape| {
        let mut req = a100(shape, 8, 64);
        req.fixed = Fixed {
            tp: Some(1),
            pp: Some(2),
            microbatch_size: Some(1),
            schedule: Some(ScheduleKind::OneFOneB),
            recompute: Some(Recompute::None),
            zero: Some(0),
            ep: Some(1),
            ..Fixed::default()
        };
        plan(&req, &mut |_| {}).unwrap().rows.remove(0)
    };
    let (m, d) = (best(moe), best(dense));
    // The MLP's 2 x 1024 x 4096 weights a layer become 8 experts of the same size.
    let (pm, pd) = (m.memory[0].parameters, d.memory[0].parameters);
    assert!(pm > 3 * pd, "{pm} vs {pd}");
    // Two experts a token: the MLP's work doubles (and a router is added).
    assert!(
        m.step_time_s > 1.2 * d.step_time_s,
        "{} vs {}",
        m.step_time_s,
        d.step_time_s
    );
}

/// An impossible request's line names the request's fields, each face its way: the same
/// line in Python's keywords (`tp=2`), with no flag in it.
#[test]
fn an_impossible_line_names_fields_each_face_writes_its_way() {
    let keyword = |f: &str, v: Option<String>| format!("{f}={}", v.unwrap_or_default());
    let python = |req: &PlanRequest| match plan(req, &mut |_| {}) {
        Err(e @ PlanError::Impossible(_)) => e.named(&keyword),
        other => panic!("expected impossible, got {other:?}"),
    };
    let mut req = a100(gpt(4, 448, 7, 128), 8, 64);
    req.fixed.tp = Some(2);
    let (cli, py) = (impossible(&req), python(&req));
    assert!(cli.starts_with("--tp 2 cannot split the 7 heads"), "{cli}");
    assert_eq!(py, cli.replacen("--tp 2", "tp=2", 1));
    let mut req = a100(gpt(4, 512, 8, 128), 8, 64);
    req.fixed.pp = Some(3);
    let py = python(&req);
    assert!(py.starts_with("pp=3 fits no configuration"), "{py}");
    assert!(!py.contains("--"), "{py}");
}

/// `--explain`'s lines name the dimensions as fields, each face its way: the CLI's
/// `--zero 0 instead of 1: ...` and `--tp, --pp: no other value ...`, Python's `zero=0` and
/// `tp=, pp=`, the rest of each line the same.
#[test]
fn explain_lines_name_dimensions_each_face_writes_its_way() {
    let keyword = |f: &str, v: Option<String>| format!("{f}={}", v.unwrap_or_default());
    let p = plan(&a100(gpt(4, 512, 8, 128), 8, 64), &mut |_| {}).unwrap();
    let fields = pipewright_plan::explain::DIMENSIONS;
    let flag = |f: &str| format!("--{}", f.replace('_', "-"));
    let (mut neighbours, mut unexplored) = (0, 0);
    for line in &p.explain {
        let (cli, py) = (line.to_string(), line.named(&keyword));
        assert!(!py.contains("--"), "{py}");
        // A neighbour's line: the flag and its value become the keyword with its value.
        if let Some(f) = fields.iter().find(|f| cli.starts_with(&(flag(f) + " "))) {
            neighbours += 1;
            assert_eq!(py, cli.replacen(&(flag(f) + " "), &format!("{f}="), 1));
        }
        if let Some((dims, rest)) = cli.split_once(": no other value was simulated") {
            unexplored += 1;
            let named: Vec<String> = dims
                .split(", ")
                .map(|d| d[2..].replace('-', "_") + "=")
                .collect();
            assert_eq!(
                py,
                format!("{}: no other value was simulated{rest}", named.join(", "))
            );
        }
    }
    assert!(neighbours > 0 && unexplored > 0, "{:?}", p.explain);
}
