//! Hand-made timelines for tests and benches: per-device orders of the classic schedules,
//! timed by a small list scheduler (uniform costs, optional comm latency). Not the project's
//! simulator; just enough to lay out realistic charts without depending on it.
#![allow(dead_code)]

use pipewright_schedule::{
    Action, ActionKind, Event, MemorySample, Timeline, TimelineMeta, TimelineSource,
};

/// Forward cost of one stage; backward is twice that, I and W one each.
pub const F_COST: f64 = 1.0;
/// Send latency between devices when comm is on.
pub const LATENCY: f64 = 0.25;

/// A timeline of `schedule` (`gpipe`, `1f1b`, `interleaved-1f1b`, `1f1b-iw`) on `p` devices,
/// `v` chunks each (loop placement), `m` microbatches. Costs shrink by `1/v` per chunk so the
/// total work does not depend on `v`.
pub fn timeline(schedule: &str, p: u32, v: u32, m: u32, comm: bool) -> Timeline {
    let orders: Vec<Vec<Action>> = (0..p).map(|r| order(schedule, p, v, m, r)).collect();
    let events = run(&orders, p, v, m, comm);
    Timeline {
        meta: TimelineMeta {
            schedule: schedule.to_string(),
            devices: p,
            stages: p * v,
            microbatches: m,
            source: TimelineSource::Simulated,
            time_unit: "units".into(),
        },
        events,
    }
}

fn cost(kind: ActionKind, v: u32) -> f64 {
    let c = match kind {
        ActionKind::F | ActionKind::I | ActionKind::W => F_COST,
        ActionKind::B => 2.0 * F_COST,
        _ => 0.0,
    };
    c / f64::from(v)
}

/// Per-device order of compute actions.
fn order(schedule: &str, p: u32, v: u32, m: u32, r: u32) -> Vec<Action> {
    let n = v * m;
    // k-th forward / backward of this device in Megatron's interleaved order.
    let fwd = |k: u32| {
        let chunk = (k / p) % v;
        let mb = (k / (p * v)) * p + k % p;
        Action::new(chunk * p + r, ActionKind::F, mb)
    };
    let bwd = |k: u32| {
        let chunk = v - 1 - (k / p) % v;
        let mb = (k / (p * v)) * p + k % p;
        Action::new(chunk * p + r, ActionKind::B, mb)
    };
    let warm = match schedule {
        "gpipe" => n,
        "interleaved-1f1b" => ((p - r - 1) * 2 + (v - 1) * p).min(n),
        _ => (p - r - 1).min(n),
    };
    let mut out: Vec<Action> = (0..warm).map(fwd).collect();
    for k in warm..n {
        out.push(fwd(k));
        out.push(bwd(k - warm));
    }
    for k in n - warm..n {
        out.push(bwd(k));
    }
    if schedule == "1f1b-iw" {
        out = out
            .into_iter()
            .flat_map(|a| match a.kind {
                ActionKind::B => vec![
                    Action::new(a.stage, ActionKind::I, a.microbatch),
                    Action::new(a.stage, ActionKind::W, a.microbatch),
                ],
                _ => vec![a],
            })
            .collect();
    }
    out
}

/// List-schedule the orders: an action starts when its device is free and its input (the
/// previous stage's F, or the next stage's B/I) has arrived.
fn run(orders: &[Vec<Action>], p: u32, v: u32, m: u32, comm: bool) -> Vec<Event> {
    let s_count = (p * v) as usize;
    let idx = |s: u32, mb: u32| s as usize * m as usize + mb as usize;
    let mut f_end = vec![f64::NAN; s_count * m as usize];
    let mut b_end = vec![f64::NAN; s_count * m as usize];
    let mut next = vec![0usize; p as usize];
    let mut free = vec![0.0f64; p as usize];
    let mut events = Vec::new();
    let last = p * v - 1;
    let lat = if comm { LATENCY } else { 0.0 };
    loop {
        let mut progress = false;
        for r in 0..p as usize {
            while let Some(a) = orders[r].get(next[r]) {
                let s = a.stage;
                let (dep, dep_dev) = match a.kind {
                    ActionKind::F if s == 0 => (0.0, r as u32),
                    ActionKind::F => (f_end[idx(s - 1, a.microbatch)], (s - 1) % p),
                    ActionKind::W => (b_end[idx(s, a.microbatch)], r as u32),
                    _ if s == last => (f_end[idx(s, a.microbatch)], r as u32),
                    _ => (b_end[idx(s + 1, a.microbatch)], (s + 1) % p),
                };
                if dep.is_nan() {
                    break;
                }
                let remote = dep_dev != r as u32;
                let arrive = if remote { dep + lat } else { dep };
                if remote && comm {
                    push_comm(&mut events, a, dep_dev, r as u32, dep, arrive, p);
                }
                let start = free[r].max(arrive);
                let end = start + cost(a.kind, v);
                events.push(Event {
                    device: r as u32,
                    action: *a,
                    start,
                    end,
                });
                free[r] = end;
                match a.kind {
                    ActionKind::F => f_end[idx(s, a.microbatch)] = end,
                    ActionKind::B | ActionKind::I => b_end[idx(s, a.microbatch)] = end,
                    _ => {}
                }
                next[r] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    assert!(
        next.iter().zip(orders).all(|(n, o)| *n == o.len()),
        "test schedule deadlocked"
    );
    events
}

/// The send on the producing device and the receive on the consuming one.
fn push_comm(ev: &mut Vec<Event>, a: &Action, from: u32, to: u32, t0: f64, t1: f64, p: u32) {
    let (send, recv, src_stage) = match a.kind {
        ActionKind::F => (ActionKind::SendF, ActionKind::RecvF, a.stage - 1),
        _ => (ActionKind::SendB, ActionKind::RecvB, a.stage + 1),
    };
    debug_assert_eq!(src_stage % p, from);
    let mb = a.microbatch;
    ev.push(Event {
        device: from,
        action: Action::new(src_stage, send, mb),
        start: t0,
        end: t1,
    });
    ev.push(Event {
        device: to,
        action: Action::new(a.stage, recv, mb),
        start: t0,
        end: t1,
    });
}

/// Stashed activations over time: +1 at each F's end, -1 at each B's (or W's) end, 1 MiB each.
pub fn memory(tl: &Timeline) -> Vec<Vec<MemorySample>> {
    let mut per: Vec<Vec<(f64, i64)>> = vec![Vec::new(); tl.meta.devices as usize];
    for e in tl.compute_events() {
        let d = match e.action.kind {
            ActionKind::F => 1,
            ActionKind::B | ActionKind::W => -1,
            _ => 0,
        };
        if d != 0 {
            per[e.device as usize].push((e.end, d));
        }
    }
    per.into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut count = 0i64;
            let mut out = vec![MemorySample {
                time: 0.0,
                count: 0,
                bytes: 0,
            }];
            for (t, d) in v {
                count += d;
                let c = count.max(0) as u32;
                out.push(MemorySample {
                    time: t,
                    count: c,
                    bytes: u64::from(c) << 20,
                });
            }
            out
        })
        .collect()
}
