//! `plan`'s table for people: its heading and one line per ranked configuration.

use pipewright::runtime::gpt_config;
use pipewright::schedule::plan::launch::model_line;
use pipewright::schedule::plan::listed::configuration;
use pipewright::schedule::plan::{Config, Dispatcher, Plan, PlanRequest, PlanRow};

/// The table's first lines: the cluster and model, what the plan looked at, the column heads.
pub fn heading(req: &PlanRequest, plan: &Plan, seconds: f64) -> String {
    let mut out = format!(
        "{} GPUs of {} ({} per node, {:.0} GiB), {}, batch {} {}, {}\n",
        req.gpus,
        req.cluster.name,
        req.cluster.gpus_per_node,
        req.cluster.memory_gib,
        model_line(req),
        req.global_batch,
        req.model.batch_unit(),
        // A profile plans its weights in the format it measured them in.
        req.model.profile().map_or_else(
            || match req.fp8 {
                true => format!("{} with FP8 GEMMs", req.precision.name()),
                false => req.precision.name().to_string(),
            },
            |p| format!("{} (the profile's weights)", p.weight_format())
        )
    );
    let p = &plan.progress;
    out += &format!(
            "{} configurations, {} checked against memory ({} did not fit), {} simulated, {} schedule searches, in {seconds:.2} s{}{}\n\n",
            p.candidates,
            p.memory_checked,
            p.unfit,
            p.simulated,
            p.searched,
            match p.refused {
                0 => String::new(),
                n => format!(" ({n} refused by a check and dropped: --explain says why)"),
            },
            if plan.cut_short {
                " (simulation budget spent: raise --max-simulated to look further)"
            } else {
                ""
            }
        );
    out
}

/// Row `i` (from 0) of the plan table.
pub fn row_line(req: &PlanRequest, i: usize, r: &PlanRow) -> String {
    format!(
        "{:>3}  {:>6}  {:>9.0}  {:>11}  {:>5}  {:>8.1}  {:>7.1}%  {:>5.1}%  {:<8}  {}\n",
        i + 1,
        if r.step_time_s >= 0.01 {
            format!("{:.3}", r.step_time_s)
        } else {
            format!("{:.1e}", r.step_time_s)
        },
        r.tokens_per_s.unwrap_or(r.samples_per_s),
        match r.tflops_per_gpu {
            None => "n/a".to_string(),
            Some(t) if t < 10.0 => format!("{t:.3}"),
            Some(t) => format!("{t:.1}"),
        },
        r.mfu
            .map_or("n/a".to_string(), |m| format!("{:.1}%", 100.0 * m)),
        r.peak_memory_bytes as f64 / f64::from(1u32 << 30),
        100.0 * r.headroom_bytes as f64 / req.cluster.memory_bytes() as f64,
        100.0 * r.bubble,
        r.limit.map_or("", |l| l.name()),
        configuration(r)
    )
}

/// Said under the launch line: what `train` refuses of the planned shape or layout (with
/// the way to the nearest run it trains), and where its run differs from what was planned.
pub(super) fn launch_note(req: &PlanRequest, c: &Config) -> String {
    let dispatch = if req.dispatcher == Dispatcher::DeepEp && c.ep > 1 {
        "  (pipewright's runtime dispatches by a plain all-to-all, not DeepEP's: its run of this line takes longer than the plan timed)\n"
    } else {
        ""
    };
    let fp8 = if req.fp8 {
        "  (pipewright's runtime computes in bf16, not FP8: its run of this line takes longer than the plan timed)\n"
    } else {
        ""
    };
    refused_launch(req, c) + dispatch + fp8
}

/// What `train` refuses of the planned shape or layout (see [`launch_note`]).
fn refused_launch(req: &PlanRequest, c: &Config) -> String {
    let shape = match req.model.gpt() {
        Some(shape) => shape,
        None => return String::new(),
    };
    if let Err(e) = gpt_config(shape) {
        let nearest = if shape.tied_embeddings {
            "; plan without --tied-embeddings for the nearest shape it trains"
        } else {
            ""
        };
        return format!("  (train refuses this line: {e}{nearest})\n");
    }
    let layout = if c.etp > 1 {
        Some(format!("--etp {}", c.etp))
    } else if c.ep > 1 && c.tp > 1 {
        Some(format!("--ep {} with --tp {}", c.ep, c.tp))
    } else if c.ep > 1 && c.zero > 0 {
        Some(format!("--ep {} with --zero {}", c.ep, c.zero))
    } else {
        None
    };
    layout.map_or_else(String::new, |l| {
        format!("  (train refuses this line: {l} does not run in pipewright's runtime yet; fix --ep 1 or --zero 0 to plan a layout it trains)\n")
    })
}
