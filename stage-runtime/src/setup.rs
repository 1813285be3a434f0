//! What an executor settles before step 0, from its timetable row and its modules: that
//! every action asked of a module is one it offers, and which microbatches recompute.

use std::collections::{HashMap, HashSet};

use pipewright_schedule::recompute::recomputed;
use pipewright_schedule::{Action, ActionKind, Recompute, RecomputePlan, Timetable};

use crate::error::RuntimeError;
use crate::executor::guard;
use crate::module::StageModule;

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
