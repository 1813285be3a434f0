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

/// The microbatches of `row` that keep their whole stash although their stage recomputes:
/// on a stage with `R`s in the row, the forwards without one (the timetable recomputes only
/// what it names). A stage that recomputes by policy alone, with no `R`, rebuilds them all.
pub(crate) fn kept_whole(
    row: &[Action],
    recompute: &HashMap<u32, Recompute>,
) -> HashSet<(u32, u32)> {
    let parts = || row.iter().flat_map(|a| a.parts());
    let named: HashSet<(u32, u32)> = parts()
        .filter(|p| p.kind == ActionKind::R)
        .map(|p| (p.stage, p.microbatch))
        .collect();
    let stages: HashSet<u32> = named.iter().map(|&(s, _)| s).collect();
    parts()
        .filter(|p| p.kind == ActionKind::F && stages.contains(&p.stage))
        .filter(|p| recompute.contains_key(&p.stage))
        .map(|p| (p.stage, p.microbatch))
        .filter(|k| !named.contains(k))
        .collect()
}
