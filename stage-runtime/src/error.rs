//! The runtime's errors: each names where it happened.

use pipewright_schedule::Action;

use crate::mesh::{Coord, MeshError};

/// Why a run stopped.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// The mesh does not fit.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The timetable cannot run on this mesh.
    #[error("timetable: {0}")]
    Timetable(String),
    /// The model or its data cannot be built.
    #[error("model: {0}")]
    Model(String),
    /// A rank failed at an action (or between actions).
    #[error("rank {rank} (pp {pp}, tp {tp}, dp {dp}), step {step}{at}: {message}", pp = .coord.pp, tp = .coord.tp, dp = .coord.dp, at = describe(.action))]
    Device {
        /// Global rank.
        rank: usize,
        /// Its coordinates.
        coord: Coord,
        /// Training step.
        step: u64,
        /// The action, when the failure was in one.
        action: Option<Action>,
        /// What went wrong.
        message: String,
    },
    /// The ranks disagree about the run: their timetables, meshes, models or seeds differ.
    #[error("rank {rank} disagrees with rank 0 about the run (timetable, mesh, model, seed, steps or precision differ): its fingerprint is {theirs:016x}, rank 0's {ours:016x}")]
    Disagree {
        /// The first rank that differs from rank 0.
        rank: usize,
        /// Rank 0's fingerprint.
        ours: u64,
        /// That rank's.
        theirs: u64,
    },
    /// The transport could not start.
    #[error("transport: {0}")]
    Transport(String),
    /// The timetable splits a backward that a stage's module computes only whole.
    #[error("schedule {schedule} splits the backward into input and weight parts (action {action}), but stage {stage}'s module has only a full backward: use a schedule without I/W actions (gpipe, 1f1b, interleaved-1f1b, looped-bfs)")]
    NoSplitBackward {
        /// The timetable's name.
        schedule: String,
        /// The stage whose module cannot split.
        stage: u32,
        /// The first I or W action of that stage on its device.
        action: Action,
    },
    /// Recomputation was asked of a stage whose module does not offer it.
    #[error("stage {stage} cannot recompute ({policy}): {reason}")]
    NoRecompute {
        /// The stage.
        stage: u32,
        /// The policy asked for.
        policy: pipewright_schedule::Recompute,
        /// The module's reason.
        reason: String,
    },
    /// ZeRO-1 over several replicas, and a stage whose module cannot shard its optimizer.
    #[error("ZeRO-1 shards the optimizer over the {dp} data-parallel replicas, but stage {stage}'s module does not implement optimizer_step_shard and set_flat_params: run without ZeRO")]
    NoShardedOptimizer {
        /// The stage.
        stage: u32,
        /// Data-parallel replicas.
        dp: usize,
    },
    /// A loss or gradient was NaN or infinite (with [`RunOptions::check_finite`](crate::RunOptions::check_finite)).
    #[error("rank {rank} (pp {pp}, tp {tp}, dp {dp}), step {step}, stage {stage}, {at}: the {what} is {value} (non-finite); the run stops at this step", pp = .coord.pp, tp = .coord.tp, dp = .coord.dp, at = non_finite_at(.microbatch, .what))]
    NonFinite {
        /// Global rank.
        rank: usize,
        /// Its coordinates.
        coord: Coord,
        /// Training step.
        step: u64,
        /// The stage.
        stage: u32,
        /// The microbatch of a loss; `None` for gradients (summed over the step).
        microbatch: Option<u32>,
        /// `loss`, `gradient`, `forward output`, `input gradient`, or `parameter` (read at
        /// the end of the run, for modules whose gradients the per-step check cannot see).
        what: &'static str,
        /// The first non-finite value found.
        value: f32,
    },
    /// What a stage handed over has the wrong shape: a forward's output against the hand-off's
    /// shape (fixed by the stage's first forward), or an input gradient against the input it
    /// belongs to. Named at the stage that produced it.
    #[error("rank {rank} (pp {pp}, tp {tp}, dp {dp}), step {step}{at}: {said}", pp = .coord.pp, tp = .coord.tp, dp = .coord.dp, at = describe(&Some(*.action)), said = handoff(.action.stage, .what, .got, .want))]
    HandOff {
        /// Global rank.
        rank: usize,
        /// Its coordinates.
        coord: Coord,
        /// Training step.
        step: u64,
        /// The action that produced it (its stage is the producing stage).
        action: Action,
        /// `forward output` or `input gradient`.
        what: &'static str,
        /// Its shape.
        got: Box<[usize]>,
        /// The shape it should have.
        want: Box<[usize]>,
    },
    /// A stage's module lacks a method this run's answer depends on (or says it has no
    /// gradients while it holds parameters): refused before the first step.
    #[error("stage {stage}: {message}")]
    Module {
        /// The stage.
        stage: u32,
        /// The method at fault.
        method: &'static str,
        /// What is missing, why this run needs it, and what to do.
        message: String,
    },
    /// Parameters whose gradient stayed exactly zero through step 0 on a stage that
    /// received a non-zero gradient ([`RunOptions::allow_unused`](crate::RunOptions::allow_unused)).
    #[error("rank {rank} (pp {pp}, tp {tp}, dp {dp}), step 0, stage {stage}: {list} got no gradient in step 0 (exactly zero after every backward, while the stage received a non-zero gradient): a layer computes its weight gradient and never stores it in the parameter's grad, or the parameter is unused; leave a frozen one out of the visit (#[parameters(skip)]), or name one that trains but has no gradient at step 0 in RunOptions::allow_unused", pp = .coord.pp, tp = .coord.tp, dp = .coord.dp, list = unused_list(.names))]
    UnusedParameters {
        /// Global rank.
        rank: usize,
        /// Its coordinates.
        coord: Coord,
        /// The stage.
        stage: u32,
        /// The parameters, as the module names them.
        names: Vec<String>,
    },
    /// A stage the timetable puts on a device has no module there.
    #[error("no module for stage {0} on this device")]
    MissingStage(u32),
}

fn handoff(stage: u32, what: &str, got: &[usize], want: &[usize]) -> String {
    if what == "input gradient" {
        format!("stage {stage}'s input gradient has shape {got:?}, but the input it belongs to has {want:?}")
    } else {
        format!(
            "stage {stage}'s {what} has shape {got:?}, but its hand-off to stage {next} has \
             {want:?} (fixed by its first forward: every microbatch hands over one shape)",
            next = stage + 1
        )
    }
}

fn unused_list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
    let more = names.len().saturating_sub(shown.len());
    let word = if names.len() == 1 {
        "parameter"
    } else {
        "parameters"
    };
    let rest = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{word} {}{rest}", shown.join(", "))
}

fn non_finite_at(microbatch: &Option<u32>, what: &str) -> String {
    match (microbatch, what) {
        (Some(m), _) => format!("microbatch {m}"),
        (None, "gradient") => "its gradients summed over the step's microbatches".into(),
        (None, _) => "after the optimizer step".into(),
    }
}

fn describe(action: &Option<Action>) -> String {
    match action {
        Some(a) => format!(", action {a} (microbatch {})", a.microbatch),
        None => String::new(),
    }
}

impl RuntimeError {
    pub(crate) fn device(
        rank: usize,
        coord: Coord,
        step: u64,
        action: Option<Action>,
        message: String,
    ) -> Self {
        RuntimeError::Device {
            rank,
            coord,
            step,
            action,
            message,
        }
    }

    pub(crate) fn missing_stage(stage: u32) -> Self {
        RuntimeError::MissingStage(stage)
    }
}
