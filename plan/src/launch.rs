//! What a plan hands its user, the same from every face: the model in one phrase, the best
//! configuration as a launch line (`pipewright train` over NCCL for a GPT; the user's own
//! program for a layer-list model), the whole plan as `plan --format json` prints it, and
//! the best's simulated step its chart draws.

use serde_json::{json, Value};

use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::shape::request::describe;
use pipewright_model::shape::{BiasKind, MlpKind, ModelShape, NormKind, PositionKind, RopeTheta};

use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::evaluate::one_step;
use super::model::PlanModel;
use super::search::{Plan, PlanRow};
use super::PlanError;

/// A row's simulated step, as the plan's chart draws it: its searched timetable's or its
/// family's, at the plan's costs, in seconds.
pub fn row_step(req: &PlanRequest, row: &PlanRow) -> Result<pipewright_sim::Simulation, PlanError> {
    let (costs, _) = cost_model(req, &row.config);
    let mut sim = match &row.searched {
        Some(s) => pipewright_sim::simulate(&s.timetable, &costs)?,
        None => one_step(&row.config, &costs)?,
    };
    sim.timeline.meta.time_unit = "s".into();
    Ok(sim)
}

/// What the launch line calls a searched timetable when no file was named for it.
pub const PLACEHOLDER: &str = "TIMETABLE.csv";

/// `path` as one shell word (`'my runs/best.csv'`), so the launch line runs as printed. A
/// path with a NUL byte, which no file can have, is written as Rust's debug form.
fn quoted(path: &str) -> String {
    shlex::try_quote(path).map_or_else(|_| format!("{path:?}"), |q| q.into_owned())
}

/// The schedule flags of the launch line: the family's, or for a searched best the
/// timetable file that replaces them (its microbatches, stages and order are in the file).
pub fn schedule_flags(best: &PlanRow, timetable: Option<&str>) -> String {
    if best.searched.is_some() {
        return format!("--timetable {}", quoted(timetable.unwrap_or(PLACEHOLDER)));
    }
    family_flags(&best.config)
}

/// A configuration's schedule as `pipewright train` flags: its family, stages, chunks and
/// microbatches.
pub fn family_flags(c: &Config) -> String {
    format!(
        "--schedule {} --stages {} --virtual {} --microbatches {}",
        c.schedule, c.pp, c.v, c.microbatches
    )
}

/// The one line a searched best needs when no timetable file was named.
pub fn searched_note(best: &PlanRow, timetable: Option<&str>) -> Option<String> {
    (best.searched.is_some() && timetable.is_none()).then(|| {
        format!("  (the best is a searched timetable no --schedule names: add --timetable-out {PLACEHOLDER} to this plan to write it)\n")
    })
}

/// `pipewright train`'s flags for configuration `c` of the GPT `shape` that `req` plans,
/// after the transport: the precision, `schedule` (the family's flags or a timetable file),
/// the microbatch size, the mesh, ZeRO, recomputation, sequence parallelism and the model's
/// sizes and kinds. The launch line and `plan --validate`'s training runs are both made of
/// these, so the run validated is the run launched.
pub fn train_flags(req: &PlanRequest, shape: &ModelShape, c: &Config, schedule: &str) -> String {
    let sp = if c.sequence_parallel {
        " --sequence-parallel"
    } else {
        ""
    };
    // Expert parallelism only where the plan chose it (`--etp` is not a `train` flag: the
    // launch note says so where the plan chose one).
    let ep = if c.ep > 1 {
        format!(" --ep {}", c.ep)
    } else {
        String::new()
    };
    format!(
        "--precision {} {schedule} --microbatch-size {} --tp {} --dp {}{ep} --zero {} --recompute {}{sp} --layers {} --d-model {} --heads {} --seq-len {} --vocab {}{}",
        req.precision.name(),
        c.microbatch_size,
        c.tp,
        c.dp,
        c.zero,
        c.recompute_plan(),
        shape.layers,
        shape.d_model,
        shape.heads,
        shape.seq_len,
        shape.vocab,
        kind_flags(shape)
    )
}

/// A GPT's best configuration as `pipewright train` over NCCL (MPI under expert
/// parallelism), one process per GPU (a
/// searched timetable as the file `timetable` names); empty for a layer-list model, whose
/// launch is [`profile_launch`].
pub fn launch(req: &PlanRequest, r: &PlanRow, timetable: Option<&str>) -> String {
    let Some(shape) = req.model.gpt() else {
        return String::new();
    };
    let schedule = schedule_flags(r, timetable);
    // Expert parallelism moves host tensors: it runs over MPI, not NCCL.
    let transport = if r.config.ep > 1 { "mpi" } else { "nccl" };
    format!(
        "mpirun -np {} pipewright train --transport {transport} {}",
        r.config.gpus(),
        train_flags(req, shape, &r.config, &schedule)
    )
}

/// How to run a layer-list model's best configuration: the user's own program, with the
/// schedule, the mesh, the microbatches and the stages' cuts (the same cuts the plan
/// costed); as text and as JSON.
pub fn profile_launch(p: &LayerProfile, r: &PlanRow) -> (String, Value) {
    let c = &r.config;
    let cuts = p.cuts(c.stages() as usize).unwrap_or_default();
    let ranges: Vec<String> = cuts
        .iter()
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect();
    let recompute = c.recompute_plan().to_string();
    let text = format!(
        "  your own program (a layer-list model is not `pipewright train`'s GPT), one process per GPU (e.g. `mpirun -np {gpus} ...`):\n    Mesh::new({pp}, {tp}, {dp}); ScheduleSpec::new(ScheduleKind::{kind:?}, {pp}, {v}, {m}, None) ({schedule}); {m} microbatches of {mbs} samples per replica\n    stages (layers; split::balanced of the profile's f+i+w, as Balance::Time cuts them): {cuts}\n    RunOptions {{ recompute: \"{recompute}\".parse()?, zero: Zero::from_level({zero}, {pp})?, ..RunOptions::default() }}\n",
        gpus = c.gpus(),
        pp = c.pp,
        tp = c.tp,
        dp = c.dp,
        kind = c.schedule,
        schedule = c.schedule,
        v = c.v,
        m = c.microbatches,
        mbs = c.microbatch_size,
        cuts = ranges.join(", "),
        zero = c.zero,
    );
    let value = json!({
        "program": "your own (a layer-list model)",
        "processes": c.gpus(),
        "schedule": c.schedule,
        "pp": c.pp,
        "tp": c.tp,
        "v": c.v,
        "dp": c.dp,
        "microbatches": c.microbatches,
        "microbatch_size": c.microbatch_size,
        "recompute": recompute,
        "zero": c.zero,
        "cuts": cuts.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
    });
    (text, value)
}

/// The model in one phrase, for the plan table's first line.
pub fn model_line(req: &PlanRequest) -> String {
    match &req.model {
        PlanModel::Gpt(s) => format!(
            "{} ({:.2}B parameters{}), {} attention",
            describe(s),
            s.parameters() as f64 / 1e9,
            match s.moe {
                // A mixture's tokens multiply only part of it.
                Some(_) => format!(", {:.2}B active", s.active_parameters() as f64 / 1e9),
                None => String::new(),
            },
            req.attention
        ),
        PlanModel::Layers(p) => format!(
            "a layer-list profile of {} layers (measured on {}, microbatches of {} samples)",
            p.len(),
            p.device,
            p.microbatch_size
        ),
    }
}

/// The model as `plan --format json` gives it: a GPT's sizes, kinds and parameter count, or
/// the profile's summary.
pub fn model_json(model: &PlanModel) -> Value {
    match model {
        PlanModel::Gpt(s) => json!({
            "layers": s.layers, "d_model": s.d_model, "heads": s.heads,
            "kv_heads": s.kv_heads, "ffn": s.ffn, "mlp": s.mlp, "norm": s.norm,
            "tied_embeddings": s.tied_embeddings, "positions": s.positions,
            // The base of rotary angles; null under learned positions, which have none.
            "rope_theta": (s.positions == PositionKind::Rotary).then_some(s.rope_theta),
            "bias": s.bias, "seq_len": s.seq_len, "vocab": s.vocab,
            "parameters": s.parameters(),
        }),
        PlanModel::Layers(p) => json!({
            "profile": { "layers": p.len(), "microbatch_size": p.microbatch_size, "device": p.device },
        }),
    }
}

/// The whole plan as `plan --format json` prints it: the request, every row with its memory
/// per device and its terms, and the best's launch (`timetable`: the file a searched best
/// is written to).
pub fn report_json(req: &PlanRequest, plan: &Plan, seconds: f64, timetable: Option<&str>) -> Value {
    let launch = plan.rows.first().map(|r| match &req.model {
        PlanModel::Gpt(_) => json!(launch(req, r, timetable)),
        PlanModel::Layers(p) => profile_launch(p, r).1,
    });
    let mut out = json!({
        "cluster": req.cluster,
        "model": model_json(&req.model),
        "batch_unit": req.model.batch_unit(),
        "gpus": req.gpus,
        "global_batch": req.global_batch,
        "precision": req.precision,
        "fp8": req.fp8,
        "attention": req.attention,
        "seconds": seconds,
        "search": plan.progress,
        "cut_short": plan.cut_short,
        "rows": plan.rows,
        "explain": plan.explain,
        "launch": launch,
    });
    // How a mixture's tokens travel, which its step times depend on.
    if req.model.gpt().is_some_and(|s| s.moe.is_some()) {
        out["dispatcher"] = json!(req.dispatcher);
        out["capacity_factor"] = json!(req.capacity_factor);
    }
    out
}

/// The flags that give `train` (or any command) this shape's kinds: those that differ from
/// the defaults, in flag form (the launch line's,
/// the one place beside the CLI that writes flags).
pub(crate) fn kind_flags(s: &ModelShape) -> String {
    let mut out = String::new();
    if s.ffn != s.mlp.default_ffn(s.d_model) {
        out += &format!(" --ffn {}", s.ffn);
    }
    if s.kv_heads != s.heads {
        out += &format!(" --kv-heads {}", s.kv_heads);
    }
    if s.mlp != MlpKind::Gelu {
        out += &format!(" --mlp {}", s.mlp);
    }
    if s.norm != NormKind::LayerNorm {
        out += &format!(" --norm {}", s.norm);
    }
    if s.tied_embeddings {
        out += " --tied-embeddings";
    }
    if s.positions != PositionKind::Learned {
        out += &format!(" --positions {}", s.positions);
        if s.rope_theta != RopeTheta::DEFAULT {
            out += &format!(" --rope-theta {}", s.rope_theta);
        }
    }
    if s.bias != BiasKind::All {
        out += &format!(" --bias {}", s.bias);
    }
    if let Some(m) = s.moe {
        out += &format!(" --experts {} --top-k {}", m.experts, m.top_k);
        if m.expert_ffn != s.ffn {
            out += &format!(" --expert-ffn {}", m.expert_ffn);
        }
        if m.shared_experts > 0 {
            out += &format!(" --shared-experts {}", m.shared_experts);
            if m.shared_ffn != m.expert_ffn {
                out += &format!(" --shared-ffn {}", m.shared_ffn);
            }
        }
        if m.dense_layers > 0 {
            out += &format!(" --dense-layers {}", m.dense_layers);
        }
        if m.every > 1 {
            out += &format!(" --moe-every {}", m.every);
        }
        if let Some(g) = m.route_groups {
            let (groups, per) = (g.groups, g.per_token);
            out += &format!(" --expert-groups {groups} --groups-per-token {per}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use pipewright_model::shape::{MlpKind, MoeKinds, ShapeKinds};

    /// A mixture's shape is written back as the flags that build it.
    #[test]
    fn a_mixture_is_written_back_as_its_flags() {
        let kinds = ShapeKinds {
            ffn: Some(12),
            mlp: Some(MlpKind::SwiGlu),
            moe: MoeKinds {
                experts: Some(4),
                top_k: Some(2),
                expert_ffn: Some(6),
                shared_experts: Some(1),
                shared_ffn: Some(5),
                dense_layers: Some(1),
                every: None,
                ..MoeKinds::default()
            },
            ..ShapeKinds::default()
        };
        let s = kinds.shape(3, 8, 2, 4, 10).unwrap();
        assert_eq!(
            super::kind_flags(&s),
            " --ffn 12 --mlp swiglu --experts 4 --top-k 2 --expert-ffn 6 --shared-experts 1 --shared-ffn 5 --dense-layers 1"
        );
    }
}
