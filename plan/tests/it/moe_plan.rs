//! A mixture of experts planned (issue 35): the expert layouts enumerated, the all-to-all
//! charged as communication that DualPipeV's overlapped pairs hide and 1F1B pays, and a fixed
//! layout that does not fit refused naming the flag.

use pipewright_model::shape::{ModelShape, MoeShape};
use pipewright_plan::explain_moe::share;
use pipewright_plan::{plan, Cluster, PlanRequest, RawPlanRequest};
use pipewright_schedule::spec::ScheduleKind;

/// 8 layers of d 1024, seq 2048; a mixture of 16 experts of width 1024, 4 a token.
fn shape(moe: bool) -> ModelShape {
    ModelShape {
        moe: moe.then_some(MoeShape {
            route_groups: None,
            experts: 16,
            top_k: 4,
            expert_ffn: 1024,
            shared_experts: 0,
            shared_ffn: 0,
            shared_gate: false,
            router_bias: false,
            dense_layers: 0,
            every: 1,
        }),
        ..ModelShape::gpt(8, 1024, 16, 4096, 2048, 32000)
    }
}

/// 16 H100s on 2 nodes, tp 1 pp 2 (so each stage's 8 GPUs span both nodes), microbatches of 1.
fn request(moe: bool, ep: Option<u32>) -> PlanRequest {
    let mut req = PlanRequest::new(shape(moe), Cluster::preset("h100-80g").unwrap(), 16, 64);
    req.fixed.tp = Some(1);
    req.fixed.pp = Some(2);
    req.fixed.microbatch_size = Some(1);
    req.fixed.ep = ep;
    req.max_searched = 0;
    req
}

#[test]
fn dualpipev_wins_where_it_hides_an_all_to_all_across_nodes_and_not_for_a_dense_model() {
    let best = |moe| plan(&request(moe, Some(8)), &mut |_| {}).unwrap().rows[0].config;
    let moe = best(true);
    assert_eq!(
        (moe.schedule, moe.ep),
        (ScheduleKind::DualPipeV, 8),
        "{moe}"
    );
    let dense = best(false);
    assert_ne!(dense.schedule, ScheduleKind::DualPipeV, "{dense}");
    assert_eq!(dense.ep, 1);
}

#[test]
fn dualpipev_hides_part_of_the_all_to_all_and_1f1b_none() {
    let req = request(true, Some(8));
    let best = plan(&req, &mut |_| {}).unwrap().rows[0].config;
    let v = share(&req, &best).unwrap().unwrap();
    assert!(v.comm > 0.0 && v.hidden > 0.2 * v.comm, "{v:?}");
    let plain = pipewright_plan::Config {
        schedule: ScheduleKind::OneFOneB,
        v: 1,
        ..best
    };
    let o = share(&req, &plain).unwrap().unwrap();
    assert_eq!(o.hidden, 0.0);
    // The same all-to-all, paid in full: a slower step.
    assert!(
        (o.comm / v.comm - 1.0).abs() < 1e-9 && o.step > v.step,
        "{o:?} {v:?}"
    );
    // A dense model has none.
    assert!(share(&request(false, None), &plain).unwrap().is_none());
}

#[test]
fn every_expert_layout_that_folds_over_a_stage_is_a_candidate() {
    let configs = pipewright_plan::space::enumerate(&request(true, None));
    let mut eps: Vec<u32> = configs.iter().map(|c| c.ep).collect();
    eps.sort_unstable();
    eps.dedup();
    // Divisors of the 16 experts that divide a stage's tp 1 x dp 8 GPUs.
    assert_eq!(eps, vec![1, 2, 4, 8]);
    assert!(configs.iter().all(|c| c.etp == 1));
}

#[test]
fn a_fixed_expert_layout_that_does_not_fit_is_refused_naming_the_flag() {
    let raw = |ep: Option<u32>, capacity: f64, experts: bool| {
        let mut r = RawPlanRequest {
            gpus: Some(16),
            global_batch: Some(64),
            capacity_factor: capacity,
            ..RawPlanRequest::default()
        };
        r.shape.layers = Some(8);
        r.shape.d_model = Some(1024);
        r.shape.heads = Some(16);
        r.shape.seq_len = Some(2048);
        if experts {
            r.shape.kinds.moe.experts = Some(16);
            r.shape.kinds.moe.top_k = Some(4);
        }
        r.fixed.ep = ep;
        r.build().map(|_| ()).unwrap_err().to_string()
    };
    assert_eq!(
        raw(Some(3), 1.0, true),
        "--ep 3 must divide the model's 16 routed experts"
    );
    assert_eq!(
        raw(Some(2), 1.0, false),
        "--ep applies to a mixture of experts; the model has no routed experts"
    );
    assert!(raw(None, 0.5, true)
        .starts_with("--capacity-factor 0.5: must be a finite number at least 1"));
    assert_eq!(raw(Some(0), 1.0, true), "--ep and --etp must be at least 1");
}

/// The launch line runs the layout planned: its expert parallelism, over MPI (the mixtures
/// move host tensors, which NCCL does not carry).
#[test]
fn the_launch_line_carries_the_expert_layout() {
    let mut req = request(true, Some(8));
    req.fixed.zero = Some(0);
    let best = &plan(&req, &mut |_| {}).unwrap().rows[0];
    let line = pipewright_plan::launch::launch(&req, best, None);
    assert!(line.contains(" --dp 8 --ep 8 --zero 0 "), "{line}");
    assert!(
        line.starts_with("mpirun -np 16 pipewright train --transport mpi "),
        "{line}"
    );
    let dense = plan(&request(false, None), &mut |_| {}).unwrap().rows[0].clone();
    let line = pipewright_plan::launch::launch(&request(false, None), &dense, None);
    assert!(
        line.contains("--transport nccl") && !line.contains("--ep"),
        "{line}"
    );
}

/// A recompute reruns the all-to-all only where it reruns the dispatch: all of it for full,
/// none for selective (attention's core and the activations), the first k layers' for every:k.
#[test]
fn a_recompute_pays_the_all_to_all_it_reruns() {
    use pipewright_schedule::recompute::Recompute;
    let req = request(true, Some(8));
    let best = plan(&req, &mut |_| {}).unwrap().rows[0].config;
    let stage0 = |recompute| {
        let cfg = pipewright_plan::Config {
            recompute,
            recompute_devices: best.pp,
            ..best
        };
        pipewright_plan::costs::cost_model(&req, &cfg).0.stages[0]
    };
    let full = stage0(Recompute::Full);
    assert!(full.f_comm > 0.0);
    assert_eq!(full.r_comm, None, "full reruns the forward's f_comm");
    assert_eq!(stage0(Recompute::Selective).r_comm, Some(0.0));
    let every = stage0(Recompute::Every(1)).r_comm.unwrap();
    let layers = pipewright_plan::costs::layers_per_stage(8, best.stages())[0];
    assert!(
        (every - full.f_comm / f64::from(layers)).abs() < 1e-12,
        "{every}"
    );
}
