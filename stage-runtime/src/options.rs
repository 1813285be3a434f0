//! How to run: [`RunOptions`], which every launcher takes and each executor reads (below
//! both, so the executor need not import a launcher).

use std::time::Duration;

use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Precision;
use pipewright_schedule::RecomputePlan;

use crate::zero::Zero;

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Training steps.
    pub steps: u64,
    /// Longest wait for a receive or a collective before the run fails.
    pub timeout: Duration,
    /// Optimizer settings (every stage gets its own AdamW).
    pub adamw: AdamWConfig,
    /// What each stage keeps from a forward until its backward; a stage with `R` actions in
    /// the timetable and no policy here recomputes fully.
    pub recompute: RecomputePlan,
    /// What the stages' backends compute in, and so what the pipeline hand-offs carry: bf16
    /// in a bf16 run (on MPI, bf16 bytes on the wire). Master weights, gradients and
    /// optimizer state are f32 in every precision.
    pub precision: Precision,
    /// ZeRO level of the data-parallel optimizer ([`Zero::One`]: sharded AdamW state).
    pub zero: Zero,
    /// Stop the run at the first non-finite loss (checked per microbatch on the last stage)
    /// or gradient (checked once per step and stage, before the optimizer) with
    /// [`RuntimeError::NonFinite`](crate::RuntimeError::NonFinite), as Megatron's NaN check
    /// does. On by default.
    pub check_finite: bool,
    /// Parameters allowed a gradient that stays exactly zero through step 0 (by the name
    /// [`StageModule::parameter_names`](crate::StageModule::parameter_names) gives, or a prefix of
    /// it). Otherwise such a parameter, on a stage that received a non-zero gradient (or loss),
    /// refuses the run at step 0 naming it and its stage, as PyTorch's DDP refuses unused
    /// parameters: its layer computes its gradient and never stores it, or is never used. A frozen
    /// parameter is better left out of the visit (`#[parameters(skip)]`: then it is not stepped
    /// either); list here one that trains but gets no gradient at step 0 (a layer behind a
    /// zero-initialised one). Not checked under ZeRO-1, whose replicas each see only their own
    /// gradients.
    pub allow_unused: Vec<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 1,
            timeout: Duration::from_secs(60),
            adamw: AdamWConfig::default(),
            recompute: RecomputePlan::default(),
            precision: Precision::F32,
            zero: Zero::Off,
            check_finite: true,
            allow_unused: Vec::new(),
        }
    }
}
