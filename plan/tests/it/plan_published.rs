//! The plan against published large-scale runs: given the published configuration and its
//! hardware, the predicted per-GPU throughput must land within 15% of the published figure;
//! left free, the plan's best must be predicted at least as fast and fit. BENCHMARKS.md holds
//! the table this prints (`cargo test -p pipewright-plan --release --test it plan_published::
//! -- --nocapture`).

use pipewright_model::memory::ModelShape;
use pipewright_plan::{plan, Cluster, Fixed, PlanRequest};
use pipewright_schedule::{Recompute, ScheduleKind};

/// A published run: model, GPUs, batch, tp, pp, TFLOP/s per GPU, where.
struct Run {
    name: &'static str,
    layers: u32,
    h: u64,
    heads: u32,
    gpus: u32,
    batch: u64,
    tp: u32,
    pp: u32,
    tflops: f64,
    source: &'static str,
}

const T1: &str = "Narayanan et al. SC'21, Table 1";
const T2: &str = "Narayanan et al. SC'21, Table 2 (PTD-P)";

/// Narayanan et al. (SC'21), A100 80 GB (DGX A100, Selene), seq 2048, vocab 51200, mixed
/// precision, full recomputation, microbatch size 1 where stated (Table 2). The 530B row of
/// Table 1 calibrated the A100 efficiency curve; every other row is held out.
const RUNS: [Run; 9] = [
    Run {
        name: "145.6B",
        layers: 80,
        h: 12288,
        heads: 96,
        gpus: 1536,
        batch: 2304,
        tp: 8,
        pp: 8,
        tflops: 148.0,
        source: T1,
    },
    Run {
        name: "310.1B",
        layers: 96,
        h: 16384,
        heads: 128,
        gpus: 1920,
        batch: 2160,
        tp: 8,
        pp: 16,
        tflops: 155.0,
        source: T1,
    },
    Run {
        name: "529.6B (calibration)",
        layers: 105,
        h: 20480,
        heads: 128,
        gpus: 2520,
        batch: 2520,
        tp: 8,
        pp: 35,
        tflops: 163.0,
        source: T1,
    },
    Run {
        name: "1008B",
        layers: 128,
        h: 25600,
        heads: 160,
        gpus: 3072,
        batch: 3072,
        tp: 8,
        pp: 64,
        tflops: 163.0,
        source: T1,
    },
    Run {
        name: "174.6B",
        layers: 96,
        h: 12288,
        heads: 96,
        gpus: 384,
        batch: 1536,
        tp: 8,
        pp: 12,
        tflops: 153.0,
        source: T2,
    },
    Run {
        name: "174.6B",
        layers: 96,
        h: 12288,
        heads: 96,
        gpus: 1536,
        batch: 1536,
        tp: 8,
        pp: 12,
        tflops: 141.0,
        source: T2,
    },
    Run {
        name: "529.6B",
        layers: 105,
        h: 20480,
        heads: 128,
        gpus: 560,
        batch: 2240,
        tp: 8,
        pp: 35,
        tflops: 171.0,
        source: T2,
    },
    Run {
        name: "529.6B",
        layers: 105,
        h: 20480,
        heads: 128,
        gpus: 2240,
        batch: 2240,
        tp: 8,
        pp: 35,
        tflops: 159.0,
        source: T2,
    },
    Run {
        name: "39.1B",
        layers: 48,
        h: 8192,
        heads: 64,
        gpus: 512,
        batch: 1536,
        tp: 8,
        pp: 2,
        tflops: 138.0,
        source: T1,
    },
];

fn request(r: &Run) -> PlanRequest {
    let shape = ModelShape::gpt(r.layers, r.h, r.heads, 4 * r.h, 2048, 51200);
    PlanRequest::new(shape, Cluster::preset("a100-80g").unwrap(), r.gpus, r.batch)
}

/// The published configuration: tp, pp, microbatch size 1, full recomputation, no ZeRO or
/// SP (2021); the schedule 1F1B or interleaved with any v, as the plan finds best.
fn published(r: &Run) -> PlanRequest {
    let mut req = request(r);
    req.fixed = Fixed {
        tp: Some(r.tp),
        pp: Some(r.pp),
        microbatch_size: Some(1),
        recompute: Some(Recompute::Full),
        zero: Some(0),
        sequence_parallel: Some(false),
        ..Fixed::default()
    };
    req
}

fn predicted(req: &PlanRequest, schedule: ScheduleKind) -> Option<(f64, String)> {
    let mut req = req.clone();
    req.fixed.schedule = Some(schedule);
    req.top = 1;
    let p = plan(&req, &mut |_| {}).ok()?;
    let r = p.rows.first()?;
    Some((r.tflops_per_gpu?, r.config.to_string()))
}

#[test]
fn published_configurations_are_predicted_within_15_percent() {
    println!("| run | GPUs | batch | tp x pp | published TFLOP/s | predicted | error | schedule | source |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for r in &RUNS {
        let req = published(r);
        let best = [ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B]
            .into_iter()
            .filter_map(|s| predicted(&req, s))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or_else(|| panic!("{}: the published configuration does not fit", r.name));
        let err = best.0 / r.tflops - 1.0;
        worst = worst.max(err.abs());
        println!(
            "| {} | {} | {} | {} x {} | {} | {:.1} | {:+.1}% | {} | {} |",
            r.name,
            r.gpus,
            r.batch,
            r.tp,
            r.pp,
            r.tflops,
            best.0,
            100.0 * err,
            best.1,
            r.source
        );
        assert!(
            err.abs() <= 0.15,
            "{}: predicted {:.1} vs published {}",
            r.name,
            best.0,
            r.tflops
        );
    }
    println!("worst error {:.1}%", 100.0 * worst);
}

#[test]
fn left_free_the_1t_plan_fits_and_beats_the_published_configuration() {
    let r = &RUNS[3];
    let free = plan(&request(r), &mut |_| {}).unwrap();
    let best = &free.rows[0];
    assert!(best.headroom_bytes >= 0, "{best:?}");
    let fixed = plan(&published(r), &mut |_| {}).unwrap();
    let given = &fixed.rows[0];
    assert!(
        best.step_time_s <= given.step_time_s,
        "free {} s ({}) vs published config {} s ({})",
        best.step_time_s,
        best.config,
        given.step_time_s,
        given.config
    );
    // The published configuration itself fits (Megatron ran it) and lands near 163.
    assert!(given.headroom_bytes >= 0);
    let tflops = given.tflops_per_gpu.expect("a GPT has FLOPs");
    assert!((tflops / 163.0 - 1.0).abs() <= 0.15, "{tflops}");
}

/// Megatron-LM's README (Megatron-Core on H100): GPT-3 175B with vocabulary 131072 and
/// sequence 4096, global batch 1152, 47% MFU on 96 H100s and 42% on 4608. The configuration
/// is not in the text, so the plan chooses it; the H100 preset was not calibrated.
#[test]
fn h100_mfu_of_the_plans_best_is_within_15_percent_of_megatron_core() {
    for (gpus, published) in [(96, 0.47), (4608, 0.42)] {
        let shape = ModelShape::gpt(96, 12288, 96, 4 * 12288, 4096, 131072);
        let mut req = PlanRequest::new(shape, Cluster::preset("h100-80g").unwrap(), gpus, 1152);
        req.top = 1;
        let best = &plan(&req, &mut |_| {}).unwrap().rows[0];
        assert!(best.headroom_bytes >= 0);
        let mfu = best.mfu.expect("a GPT has FLOPs");
        let err = mfu / published - 1.0;
        println!(
            "{gpus} H100: predicted MFU {:.1}% vs {:.0}% ({:+.1}%), {}",
            100.0 * mfu,
            100.0 * published,
            100.0 * err,
            best.config
        );
        assert!(err.abs() <= 0.15, "{gpus} GPUs: {mfu} vs {published}");
    }
}
