//! What an executor settles before step 0, from its timetable row and its modules: that
//! every action asked of a module is one it offers, and which microbatches recompute.

use std::any::Any;
use std::collections::{HashMap, HashSet};

use pipewright_schedule::recompute::recomputed;
use pipewright_schedule::{Action, ActionKind, Recompute, RecomputePlan, Timetable};

use crate::error::RuntimeError;
use crate::mesh::{Coord, Mesh};
use crate::module::{guard, unimplemented_method, ModuleError, ParamName, StageModule};
use pipewright_kernels::{Shaped, Tensor};

/// Refuse a row asking a module with only a full backward for an I or W action, naming
/// the schedule, the stage and the first such action.
pub(crate) fn check_backward_split<M: StageModule>(
    tt: &Timetable,
    device: usize,
    modules: &HashMap<u32, M>,
) -> Result<(), RuntimeError> {
    let split = tt.devices[device]
        .iter()
        .flat_map(|a| a.parts())
        .filter(|p| matches!(p.kind, ActionKind::I | ActionKind::W))
        .find(|p| modules.get(&p.stage).is_some_and(|m| !m.splits_backward()));
    match split {
        Some(action) => Err(RuntimeError::NoSplitBackward {
            schedule: tt.name.clone(),
            stage: action.stage,
            action,
        }),
        None => Ok(()),
    }
}

/// Refuse, under `tp > 1`, a module that would not shard its stage
/// ([`StageModule::check_tp`]), naming the stage (the lowest, so every rank says the same).
pub(crate) fn check_tp<M: StageModule>(
    modules: &HashMap<u32, M>,
    tp: usize,
) -> Result<(), RuntimeError> {
    if tp < 2 {
        return Ok(());
    }
    let mut stages: Vec<&u32> = modules.keys().collect();
    stages.sort_unstable();
    for &stage in stages {
        guard(|| modules[&stage].check_tp(tp)).map_err(|e| RuntimeError::Module {
            stage,
            method: "check_tp",
            message: e.to_string(),
        })?;
    }
    Ok(())
}

/// Tell each of this device's modules its recompute policy (only those that recompute are
/// asked), refusing in one line naming the stage a module that cannot. A stage with `R`
/// actions in the timetable and no policy recomputes fully. Returns the stages that
/// recompute.
pub(crate) fn set_recompute<M: StageModule>(
    tt: &Timetable,
    plan: &RecomputePlan,
    modules: &mut HashMap<u32, M>,
) -> Result<HashMap<u32, Recompute>, RuntimeError> {
    plan.check(tt.num_stages())
        .map_err(|e| RuntimeError::Timetable(e.to_string()))?;
    let explicit = recomputed(tt);
    let mut out = HashMap::new();
    for (&stage, module) in modules.iter_mut() {
        let policy = match plan.of(stage) {
            Recompute::None if explicit.contains(&stage) => Recompute::Full,
            policy => policy,
        };
        if policy == Recompute::None {
            continue;
        }
        guard(|| module.set_recompute(policy)).map_err(|e| RuntimeError::NoRecompute {
            stage,
            policy,
            reason: e.to_string(),
        })?;
        out.insert(stage, policy);
    }
    Ok(out)
}

/// The microbatches of `row` that keep their whole stash although their stage recomputes
/// ([`kept_whole`](pipewright_schedule::recompute::kept_whole), the rule the memory walk
/// counts), of the stages this device recomputes.
pub(crate) fn kept_whole(
    row: &[Action],
    recompute: &HashMap<u32, Recompute>,
) -> HashSet<(u32, u32)> {
    let mut whole = pipewright_schedule::recompute::kept_whole(row);
    whole.retain(|(s, _)| recompute.contains_key(s));
    whole
}

/// Why a run needs `method` of a stage's module, for the one line that refuses it.
pub(crate) fn needed_for(method: &str, dp: usize) -> String {
    match method {
        "flat_grads" | "set_flat_grads" => format!(
            "its module does not implement {method}, which dp = {dp} needs: flat_grads and \
             set_flat_grads sum a stage's gradients over the data-parallel replicas, and \
             without them each replica would step on its own gradients (a stage without \
             parameters returns Ok(None) from flat_grads)"
        ),
        "non_finite_grad" => "its module does not implement non_finite_grad, which the NaN check \
             (RunOptions::check_finite, on by default) needs for gradients that are not host \
             tensors: implement it, or turn the check off"
            .into(),
        "optimizer_step" => "its module does not implement optimizer_step, but it holds \
             parameters (flat_grads, flat_params or parameter_bytes shows them), which would \
             never change"
            .into(),
        "recompute" => "its module accepted a recompute policy (set_recompute) but does not \
             implement recompute, which must rebuild what the policy dropped"
            .into(),
        "backward_input" | "backward_weight" => format!(
            "its module does not implement {method}, which the schedule's I and W actions need \
             (a module with only a full backward returns false from splits_backward)"
        ),
        other => format!("its module does not implement {other}"),
    }
}

/// The value a probe of `set_flat_grads` puts at index `i`: small integers, exact in every
/// number format a module may keep its gradients in.
fn probe_value(i: usize) -> f32 {
    (i % 64 + 1) as f32
}

/// Set a module's gradients to `g` (itself, zero before the first step), as the all-reduce
/// will. For host tensors, first set a known pattern and read it back through `flat_grads`:
/// a `set_flat_grads` that does not set what `flat_grads` reads (one that does nothing)
/// would leave each replica on its own gradients. Returns the first index read back wrong.
fn set_grads_probed<M: StageModule>(
    module: &mut M,
    g: M::Tensor,
) -> Result<Option<usize>, (&'static str, ModuleError)>
where
    M::Tensor: 'static,
{
    let pattern = (&g as &dyn Any)
        .downcast_ref::<Tensor>()
        .and_then(|h| Tensor::new(h.shape(), (0..h.numel()).map(probe_value).collect()).ok())
        .and_then(|p| (Box::new(p) as Box<dyn Any>).downcast::<M::Tensor>().ok());
    let mut wrong = None;
    if let Some(p) = pattern {
        let n = p.numel();
        guard(|| module.set_flat_grads(*p)).map_err(|e| ("set_flat_grads", e))?;
        let back = guard(|| module.flat_grads()).map_err(|e| ("flat_grads", e))?;
        let host = back
            .as_ref()
            .and_then(|b| (b as &dyn Any).downcast_ref::<Tensor>());
        wrong = match host {
            Some(b) if b.numel() == n => b
                .data()
                .iter()
                .enumerate()
                .position(|(i, v)| *v != probe_value(i)),
            _ => Some(0),
        };
    }
    guard(|| module.set_flat_grads(g)).map_err(|e| ("set_flat_grads", e))?;
    Ok(wrong)
}

/// What the executor learns about its modules before step 0: the parameter and gradient
/// bytes of modules that do not say them (from their flat views), by stage.
pub(crate) type Sizes = HashMap<u32, (u64, u64)>;

/// Refuse, before the first step, a module missing a method this run's answer depends on,
/// naming the stage and the method: under `dp > 1`, `flat_grads` and `set_flat_grads`
/// (probed by setting the gradients to themselves, zero before the first step); with the NaN
/// check, a `non_finite_grad` that can read the gradients. Returns the sizes of modules
/// that do not report them.
pub(crate) fn check_methods<M: StageModule>(
    modules: &mut HashMap<u32, M>,
    dp: usize,
    sharded: bool,
    check_finite: bool,
) -> Result<Sizes, RuntimeError>
where
    M::Tensor: 'static,
{
    let mut stages: Vec<u32> = modules.keys().copied().collect();
    stages.sort_unstable();
    let mut sizes = Sizes::new();
    for stage in stages {
        let module = modules
            .get_mut(&stage)
            .ok_or(RuntimeError::MissingStage(stage))?;
        if let Some(bytes) = check_stage(module, stage, dp, sharded, check_finite)? {
            sizes.insert(stage, bytes);
        }
    }
    Ok(sizes)
}

/// One stage's methods, as [`check_methods`] checks them: its parameter and gradient bytes
/// when the module does not say them and its flat views show some.
fn check_stage<M: StageModule>(
    module: &mut M,
    stage: u32,
    dp: usize,
    sharded: bool,
    check_finite: bool,
) -> Result<Option<(u64, u64)>, RuntimeError>
where
    M::Tensor: 'static,
{
    let failed = |method, e| method_failed(stage, dp, method, e);
    let grads = guard(|| module.flat_grads());
    let reported = module.parameter_bytes();
    let params = if reported == 0 {
        let flat = guard(|| module.flat_params()).map_err(|e| failed("flat_params", e))?;
        flat.map_or(0, |p| p.len())
    } else {
        0
    };
    let grad_numel = match &grads {
        Ok(Some(g)) => g.numel(),
        _ => 0,
    };
    if dp > 1 {
        check_replica_grads(module, stage, grads, (params, reported), dp, sharded)?;
    }
    if check_finite {
        guard(|| module.non_finite_grad()).map_err(|e| failed("non_finite_grad", e))?;
    }
    let f32s = |n: usize| 4 * n as u64;
    let grad_bytes = if module.gradient_bytes() == 0 {
        f32s(grad_numel)
    } else {
        0
    };
    Ok((params > 0 || grad_bytes > 0).then_some((f32s(params), grad_bytes)))
}

/// A method that failed (or is missing) before the first step, as the refusal naming it.
fn method_failed(stage: u32, dp: usize, method: &'static str, e: ModuleError) -> RuntimeError {
    let message = match unimplemented_method(&e) {
        Some(_) => needed_for(method, dp),
        None => format!("{method} failed before the first step: {e}"),
    };
    RuntimeError::Module {
        stage,
        method,
        message,
    }
}

/// With `dp > 1`, what the replicas' gradient sum needs of a stage: `flat_grads` holds a
/// gradient for every parameter (`params` from `flat_params`, or the `reported` bytes), and,
/// unless ZeRO-1 shards the step, `set_flat_grads` sets what `flat_grads` reads.
fn check_replica_grads<M: StageModule>(
    module: &mut M,
    stage: u32,
    grads: Result<Option<M::Tensor>, ModuleError>,
    (params, reported): (usize, usize),
    dp: usize,
    sharded: bool,
) -> Result<(), RuntimeError>
where
    M::Tensor: 'static,
{
    let refuse = |method: &'static str, message: String| RuntimeError::Module {
        stage,
        method,
        message,
    };
    match grads {
        Err(e) => Err(method_failed(stage, dp, "flat_grads", e)),
        Ok(None) if params > 0 || reported > 0 => {
            let shown = if params > 0 {
                format!("flat_params shows {params} parameters")
            } else {
                format!("parameter_bytes says it holds {reported} bytes of parameters")
            };
            let message = format!(
                "its module's flat_grads says it has no gradients, but {shown}: \
                 dp = {dp} sums a stage's gradients over the data-parallel replicas \
                 through flat_grads and set_flat_grads"
            );
            Err(refuse("flat_grads", message))
        }
        // Gradients left out of flat_grads would never be summed over the replicas.
        Ok(Some(g)) if params > 0 && g.numel() != params => {
            let message = format!(
                "its module's flat_grads holds {} gradients, but flat_params shows \
                 {params} parameters: dp = {dp} sums only what flat_grads holds over \
                 the data-parallel replicas, so every parameter needs its gradient \
                 there, in flat_params' order",
                g.numel()
            );
            Err(refuse("flat_grads", message))
        }
        Ok(Some(g)) if !sharded => {
            let n = g.numel();
            match set_grads_probed(module, g) {
                Err((method, e)) => Err(method_failed(stage, dp, method, e)),
                Ok(Some(i)) => {
                    let message = format!(
                        "its module's set_flat_grads does not set what flat_grads \
                         reads (value {i} of {n} differs when read back): dp = {dp} \
                         hands each stage its summed gradients through set_flat_grads, \
                         and without them each replica would step on its own gradients"
                    );
                    Err(refuse("set_flat_grads", message))
                }
                Ok(None) => Ok(()),
            }
        }
        Ok(_) => Ok(()),
    }
}

/// Refuse, before any rank starts, data-parallel replicas of a stage that would start from
/// different parameters: the gradient all-reduce keeps replicas in step only from an equal
/// start, and a `make` that draws its weights from a thread's random generator or from the
/// replica index would train `dp` different models while the run reports replica 0's (issue
/// 24's class: nothing would show the split). Builds each replica's module once more, one at a
/// time, on the calling thread, and compares its `flat_params` bit for bit with replica 0's;
/// a module that does not show its parameters cannot be compared and is left to its author.
/// Only under `dp > 1`, so a one-replica run pays nothing.
pub(crate) fn check_replicas_agree<M, MF>(
    mesh: Mesh,
    tt: &Timetable,
    make: &MF,
) -> Result<(), RuntimeError>
where
    M: StageModule,
    MF: Fn(Coord, u32) -> Result<M, ModuleError>,
{
    // A timetable for another pipeline size is refused by `prepare` in the run itself; the
    // stage-to-device map needs no lowering, so none is done here.
    if mesh.dp < 2 || tt.num_devices() as usize != mesh.pp {
        return Ok(());
    }
    for stage in 0..tt.num_stages() {
        let pp = tt.stage_device[stage as usize] as usize;
        for tp in 0..mesh.tp {
            let params = |dp: usize| {
                let coord = Coord { pp, tp, dp };
                let fail = |m: String| RuntimeError::device(mesh.rank(coord), coord, 0, None, m);
                let mut module =
                    make(coord, stage).map_err(|e| fail(format!("building stage {stage}: {e}")))?;
                let flat = guard(|| module.flat_params())
                    .map_err(|e| fail(format!("stage {stage}: flat_params failed: {e}")))?;
                let experts = module.expert_ranges().unwrap_or_default();
                Ok::<_, RuntimeError>(flat.map(|f| (f, module.parameter_names(), experts)))
            };
            // Under expert parallelism replica `dp` holds the experts of EP rank `dp % ep`,
            // as the first `ep` replicas do between them.
            let ep = mesh.ep.max(1);
            let refuse = |message| RuntimeError::Module {
                stage,
                method: "make",
                message,
            };
            // Replica 0's replicated values (experts aside), kept from its own turn below.
            let mut zero_shared: Option<Vec<f32>> = None;
            for first_dp in 0..ep.min(mesh.dp) {
                let Some((first, names, experts)) = params(first_dp)? else {
                    continue;
                };
                for dp in (first_dp + ep..mesh.dp).step_by(ep) {
                    let Some((other, _, _)) = params(dp)? else {
                        continue;
                    };
                    let at = (first_dp, dp, mesh.tp > 1, tp);
                    if let Some(message) = differ(&first, &other, names.as_deref(), at) {
                        return Err(refuse(message));
                    }
                }
                // The EP ranks' own experts differ; everything else is replicated and must
                // start equal to replica 0's.
                if ep == 1 {
                    continue;
                }
                let shared = without(&first, &experts);
                match &zero_shared {
                    None if first_dp == 0 => zero_shared = Some(shared),
                    None => {}
                    Some(zero) => {
                        let at = (0, first_dp, mesh.tp > 1, tp);
                        if let Some(message) = differ(zero, &shared, names.as_deref(), at) {
                            return Err(refuse(message));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// `flat` with the values in `experts` set to 0, so that two EP ranks compare on what they
/// share.
fn without(flat: &[f32], experts: &[std::ops::Range<usize>]) -> Vec<f32> {
    let mut out = flat.to_vec();
    for r in experts {
        if let Some(part) = out.get_mut(r.clone()) {
            part.fill(0.0);
        }
    }
    out
}

/// Why replica `dp`'s parameters are not replica 0's, if they are not (bit for bit), naming
/// the parameter when the module names them.
fn differ(
    first: &[f32],
    other: &[f32],
    names: Option<&[ParamName]>,
    (first_dp, dp, with_tp, tp): (usize, usize, bool, usize),
) -> Option<String> {
    let at = if with_tp {
        format!(" (tp rank {tp})")
    } else {
        String::new()
    };
    let what = if first.len() != other.len() {
        format!("{} parameters against {}", first.len(), other.len())
    } else {
        let i = first
            .iter()
            .zip(other)
            .position(|(a, b)| a.to_bits() != b.to_bits())?;
        let name = names
            .and_then(|n| ParamName::at(n, i))
            .unwrap_or_else(|| format!("value {i} of the flat parameters"));
        format!("{name} is {} against {}", first[i], other[i])
    };
    Some(format!(
        "data-parallel replicas {first_dp} and {dp}{at} build it with different parameters ({what}): \
         every replica must start from the same values, as one device would; build each \
         layer from its index or from a seed that depends on neither the replica nor the call"
    ))
}
