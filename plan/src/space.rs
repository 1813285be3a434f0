//! The configurations a request allows: every (tp, pp, dp, microbatch size and count,
//! schedule family and v, recompute, ZeRO, SP) that divides the GPUs, the heads and the batch,
//! with the user's fixed dimensions taken as given.

use super::config::{Config, PlanRequest};
use super::fit::memory_config;
use super::model::PlanModel;
use super::refused::Refusals;
use pipewright_schedule::recompute::Recompute;
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};

/// Divisors of `n`, ascending.
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d <= n / d {
        if n % d == 0 {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// TP sizes the request allows: dividing the key/value heads (so the query heads too; as
/// Megatron-LM splits them, each rank holding whole key/value groups), the MLP width and the
/// GPUs, and (unless cross-node TP is allowed) the node, so a TP group never spans nodes. A
/// profile's layers run at the TP degree they were measured at (their bytes are one rank's
/// shard at that degree): its `tp` alone.
pub fn tp_options(req: &PlanRequest) -> Vec<u32> {
    let gpn = req.cluster.gpus_per_node;
    let candidates: Vec<u32> = match &req.model {
        PlanModel::Gpt(shape) => divisors(u64::from(shape.kv_heads))
            .into_iter()
            .filter(|t| shape.ffn % t == 0)
            .map(|t| t as u32)
            .collect(),
        PlanModel::Layers(profile) => vec![profile.tp],
    };
    candidates
        .into_iter()
        .filter(|&t| req.gpus % t == 0)
        .filter(|&t| req.allow_cross_node_tp || (t <= gpn && gpn % t == 0))
        .filter(|&t| req.fixed.tp.map_or(true, |f| f == t))
        .collect()
}

/// (family, v) pairs for `pp` devices and `m` microbatches that the family can schedule and
/// the layers can fill (`pp * v <= layers`).
pub fn schedules(req: &PlanRequest, pp: u32, m: u32) -> Vec<(ScheduleKind, u32)> {
    let mut out = Vec::new();
    let families: Vec<ScheduleKind> = match req.fixed.schedule {
        // A fixed family is honoured, or the configuration is not one: on one device only
        // 1F1B stands for all (any other family there would be a row labelled as what it is
        // not).
        Some(kind) if pp == 1 && kind != ScheduleKind::OneFOneB => return out,
        Some(kind) => vec![kind],
        // One device: every family is the same sequence of F and B.
        None if pp == 1 => vec![ScheduleKind::OneFOneB],
        None => ScheduleKind::ALL.to_vec(),
    };
    for kind in families {
        // GPipe and looped BFS hold every microbatch at once, with the bubble of 1F1B and
        // interleaving: past 16p microbatches they cost m/p times the memory for nothing, and
        // walking their timetables would cost the plan seconds. Tried only when fixed.
        let holds_all = matches!(kind, ScheduleKind::GPipe | ScheduleKind::LoopedBfs);
        if holds_all && req.fixed.schedule.is_none() && u64::from(m) > 16 * u64::from(pp) {
            continue;
        }
        let vs: Vec<u32> = match kind.fixed_virtual() {
            Some(v) => vec![v],
            None if kind.supports_virtual() => (2..=req.max_virtual).collect(),
            None => vec![1],
        };
        for v in vs {
            if req.fixed.v.is_some_and(|f| f != v) {
                continue;
            }
            let fits = u64::from(pp) * u64::from(v) <= u64::from(req.model.layers());
            if fits && ScheduleSpec::new(kind, pp, v, m, None).is_ok() {
                out.push((kind, v));
            }
        }
    }
    out
}

/// Every configuration the request allows (before memory).
pub fn enumerate(req: &PlanRequest) -> Vec<Config> {
    enumerate_counted(req).0
}

/// Every configuration the request allows (before memory), and those the memory model's
/// checks of sizes against each other refuse (sequence parallelism needs `tp` to divide the
/// sequence, for one): a refused candidate is dropped, not the plan.
pub fn enumerate_counted(req: &PlanRequest) -> (Vec<Config>, Refusals) {
    let mut all = Vec::new();
    let mut refused = Refusals::default();
    for_each_shape(req, &mut all);
    let Some(shape) = req.model.gpt() else {
        return (all, refused);
    };
    all.retain(|c| match memory_config(req, shape, c).check() {
        Ok(()) => true,
        Err(e) => {
            refused.note(c, e);
            false
        }
    });
    (all, refused)
}

/// Every configuration the dimensions' divisibility allows, into `out`.
fn for_each_shape(req: &PlanRequest, out: &mut Vec<Config>) {
    for tp in tp_options(req) {
        for pp in divisors(u64::from(req.gpus / tp)) {
            let pp = pp as u32;
            if pp > req.model.layers() || req.fixed.pp.is_some_and(|f| f != pp) {
                continue;
            }
            let dp = req.gpus / tp / pp;
            if req.global_batch % u64::from(dp) != 0 {
                continue;
            }
            let per_replica = req.global_batch / u64::from(dp);
            for mbs in divisors(per_replica) {
                // A profile's microbatches are of its size unless fixed (then scaled).
                let allowed = match (req.fixed.microbatch_size, req.model.profile()) {
                    (Some(f), _) => f == mbs,
                    (None, Some(p)) => mbs == p.microbatch_size,
                    (None, None) => mbs <= req.max_microbatch_size,
                };
                let Ok(m) = u32::try_from(per_replica / mbs) else {
                    continue;
                };
                if !allowed {
                    continue;
                }
                for (schedule, v) in schedules(req, pp, m) {
                    let base = Config {
                        tp,
                        pp,
                        dp,
                        v,
                        microbatch_size: mbs,
                        microbatches: m,
                        schedule,
                        recompute: Recompute::None,
                        recompute_devices: pp,
                        zero: 0,
                        sequence_parallel: false,
                        ep: 1,
                        etp: 1,
                    };
                    for (ep, etp) in expert_layouts(req, tp * dp) {
                        levers(req, Config { ep, etp, ..base }, out);
                    }
                }
            }
        }
    }
}

/// `(ep, etp)` pairs for a stage of `group = tp x dp` GPUs: for a mixture, every EP dividing
/// its routed experts with `etp x ep` dividing the group (etp 1 unless fixed); `(1, 1)` for a
/// dense model.
fn expert_layouts(req: &PlanRequest, group: u32) -> Vec<(u32, u32)> {
    let Some(moe) = req.model.gpt().and_then(|s| s.moe) else {
        return vec![(1, 1)];
    };
    let etp = req.fixed.etp.unwrap_or(1);
    divisors(u64::from(moe.experts))
        .into_iter()
        .map(|ep| ep as u32)
        .filter(|&ep| req.fixed.ep.map_or(true, |f| f == ep))
        .filter(|&ep| u64::from(group) % (u64::from(ep) * u64::from(etp)) == 0)
        .map(|ep| (ep, etp))
        .collect()
}

/// `base` with every allowed recompute policy, ZeRO level and SP setting.
fn levers(req: &PlanRequest, base: Config, out: &mut Vec<Config>) {
    let f = &req.fixed;
    let policies = match (f.recompute, &req.model) {
        (Some(r), _) => vec![r],
        (None, PlanModel::Gpt(_)) => vec![Recompute::None, Recompute::Selective, Recompute::Full],
        (None, PlanModel::Layers(_)) => vec![Recompute::None, Recompute::Full],
    };
    let zeros: Vec<u8> = match f.zero {
        Some(z) => vec![z],
        None if base.dp > 1 => vec![0, 1],
        None => vec![0],
    };
    let sps: Vec<bool> = match f.sequence_parallel {
        Some(s) => vec![s],
        // A profile's layers have no sequence parallelism to turn on.
        None if base.tp > 1 && req.model.gpt().is_some() => vec![false, true],
        None => vec![false],
    };
    for &recompute in &policies {
        for &zero in &zeros {
            for &sequence_parallel in &sps {
                out.push(Config {
                    recompute,
                    zero,
                    sequence_parallel,
                    ..base
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_are_all_found_in_order() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(divisors(1), vec![1]);
    }
}
