//! `search`'s list scheduler as a family of the plan: where it beats every generator family
//! it ranks first, its figures are its own timetable's, and where sizes forbid it the plan is
//! what it was without it.

use pipewright_model::memory::{predict, ModelShape};
use pipewright_plan::costs::cost_model;
use pipewright_plan::fit::{memory_config, worst};
use pipewright_plan::listed::{configuration, period, MAX_SEARCHED_SIZE};
use pipewright_plan::{plan, Cluster, Fixed, PlanRequest};
use pipewright_schedule::{from_csv, lower, to_csv, Checked};

/// 16 layers of d_model 2048 with a 128k vocabulary (a heavy LM head on the last stage) on
/// 4 GPUs of 14 GiB: 1F1B-like families fit only by recomputing, or hold fewer microbatches
/// at a cost in bubble; a list schedule under the cap needs neither.
fn tight(batch: u64) -> PlanRequest {
    let cluster = Cluster::from_json(
        r#"{ "name": "small", "gpus_per_node": 8, "memory_gib": 14,
             "peak_tflops": { "bf16": 100, "tf32": 50, "f32": 10 },
             "memory_bandwidth_gbs": 900,
             "intra_node": { "bandwidth_gbs": 50, "latency_us": 5 },
             "inter_node": { "bandwidth_gbs": 10, "latency_us": 10 } }"#,
    )
    .unwrap();
    let shape = ModelShape::gpt(16, 2048, 16, 4 * 2048, 2048, 128_000);
    let mut req = PlanRequest::new(shape, cluster, 4, batch);
    req.fixed = Fixed {
        tp: Some(1),
        pp: Some(4),
        microbatch_size: Some(1),
        ..Fixed::default()
    };
    req
}

#[test]
fn a_list_schedule_that_beats_every_family_ranks_first_with_its_own_period() {
    let req = tight(32);
    let p = plan(&req, &mut |_| {}).unwrap();
    let best = &p.rows[0];
    let searched = best
        .searched
        .as_ref()
        .unwrap_or_else(|| panic!("no searched best: {:?}", p.rows[0].config));
    assert!(
        configuration(best).contains("searched (list v="),
        "{}",
        configuration(best)
    );
    // Faster than every generator family simulated, recomputing or not.
    let (fastest_fixed, step) = p.simulated[0];
    assert!(
        best.step_time_s < step,
        "{} vs {fastest_fixed}: {step}",
        best.step_time_s
    );
    assert_eq!(searched.fixed_step_s, step);
    // It fits without recomputation, where the best fixed family of its shape recomputes.
    assert!(best.peak_memory_bytes <= req.cluster.memory_bytes());
    assert_eq!(best.config.recompute, pipewright_schedule::Recompute::None);
    assert_ne!(
        searched.fixed.recompute,
        pipewright_schedule::Recompute::None
    );
    // The timetable, written as `plan --timetable-out` writes it and read back, validates,
    // and its simulated period and predicted memory are the row's.
    let csv = to_csv(&lower(&searched.timetable).unwrap());
    let (back, _) = from_csv(&csv).unwrap();
    let back = Checked::new(back).unwrap();
    let (costs, _) = cost_model(&req, &best.config);
    let again = period(&back, &costs).unwrap();
    assert!(
        (again / best.step_time_s - 1.0).abs() < 1e-12,
        "{again} vs {}",
        best.step_time_s
    );
    let memory = predict(
        &memory_config(&req, req.model.gpt().unwrap(), &best.config),
        &back,
    )
    .unwrap();
    assert_eq!(worst(&memory), best.peak_memory_bytes);
    // --explain says what the search bought.
    let first = p.explain[0].to_string();
    assert!(
        first.starts_with("search: ") && first.contains("% faster than the best fixed family"),
        "{:?}",
        p.explain
    );
    // Turned off, the same request ranks the generator families only.
    let mut off = req.clone();
    off.max_searched = 0;
    let q = plan(&off, &mut |_| {}).unwrap();
    assert!(q.rows.iter().all(|r| r.searched.is_none()));
    assert_eq!(q.rows[0].config, searched.fixed);
    assert_eq!(q.progress.searched, 0);
    // A family or recomputation fixed by hand is kept: no searched timetable is that family.
    let mut fixed = req.clone();
    fixed.fixed.schedule = Some(pipewright_schedule::ScheduleKind::ZbH1);
    let f = plan(&fixed, &mut |_| {}).unwrap();
    assert!(f.rows.iter().all(|r| r.searched.is_none()) && f.progress.searched == 0);
    let mut full = req.clone();
    full.fixed.recompute = Some(pipewright_schedule::Recompute::Full);
    let f = plan(&full, &mut |_| {}).unwrap();
    assert!(f.progress.searched > 0);
    assert!(f
        .rows
        .iter()
        .all(|r| r.config.recompute == pipewright_schedule::Recompute::Full));
}

#[test]
fn sizes_over_the_limit_are_not_searched_and_the_plan_is_unchanged() {
    // 4 devices x 128 microbatches is over the limit.
    let req = tight(128);
    const { assert!(4 * 128 > MAX_SEARCHED_SIZE) };
    let p = plan(&req, &mut |_| {}).unwrap();
    assert_eq!(p.progress.searched, 0);
    let mut off = req.clone();
    off.max_searched = 0;
    let q = plan(&off, &mut |_| {}).unwrap();
    assert_eq!(p.rows, q.rows);
    assert_eq!(p.explain, q.explain);
}

/// A small GPT on 4 GPUs of a cluster whose links are slow next to its compute, nothing fixed:
/// the searched best (pp 2) is of another shape than the best generator family (pp 1).
fn small_free() -> PlanRequest {
    let cluster = Cluster::from_json(
        r#"{ "name": "small", "gpus_per_node": 8, "memory_gib": 0.05,
             "peak_tflops": { "bf16": 100, "tf32": 50, "f32": 10 },
             "memory_bandwidth_gbs": 900,
             "intra_node": { "bandwidth_gbs": 50, "latency_us": 5 },
             "inter_node": { "bandwidth_gbs": 10, "latency_us": 10 } }"#,
    )
    .unwrap();
    let shape = ModelShape::gpt(8, 64, 2, 4 * 64, 16, 64);
    let mut req = PlanRequest::new(shape, cluster, 4, 16);
    req.precision = pipewright_plan::Precision::F32;
    req
}

#[test]
fn a_searched_best_s_neighbours_differ_from_the_best_not_from_another_shape() {
    let p = plan(&small_free(), &mut |_| {}).unwrap();
    let best = &p.rows[0];
    assert!(best.searched.is_some(), "{:?}", best.config);
    let first_fixed = p.rows.iter().find(|r| r.searched.is_none()).unwrap();
    assert_ne!(
        (first_fixed.config.pp, first_fixed.config.dp),
        (best.config.pp, best.config.dp),
        "the scenario needs a best fixed family of another shape"
    );
    // Each neighbour line names the best's own value as the one it replaced.
    let c = &best.config;
    for (flag, value) in [
        ("--tp ", c.tp.to_string()),
        ("--pp ", c.pp.to_string()),
        ("--microbatch-size ", c.microbatch_size.to_string()),
        ("--zero ", c.zero.to_string()),
    ] {
        let lines = p.explain.iter().map(|l| l.to_string());
        for line in lines.filter(|l| l.starts_with(flag)) {
            assert!(
                line.contains(&format!(" instead of {value}: ")),
                "{line} (best: {})",
                configuration(best)
            );
        }
    }
    assert!(
        p.explain.iter().any(|l| l.to_string().starts_with("--pp ")),
        "{:?}",
        p.explain
    );
}
