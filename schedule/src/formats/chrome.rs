//! Chrome trace (Perfetto) JSON of a timeline: a compute track and a comm track per device,
//! and a flow arrow from each send to its receive.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::action::{Action, ActionKind};
use crate::timeline::{Event, Timeline};

/// Microseconds per timeline unit. Abstract simulator units show as milliseconds.
fn micros_per_unit(unit: &str) -> f64 {
    match unit {
        "ns" => 1e-3,
        "us" => 1.0,
        "s" => 1e6,
        _ => 1e3,
    }
}

/// The trace as a JSON value (`{"traceEvents": [...]}`), ready for `serde_json::to_string`.
pub fn chrome_trace(timeline: &Timeline) -> Value {
    let scale = micros_per_unit(&timeline.meta.time_unit);
    let mut events = Vec::with_capacity(timeline.events.len() + 4 * timeline.meta.devices as usize);
    for d in 0..timeline.meta.devices {
        for (tid, name) in [
            (2 * d, format!("device {d}")),
            (2 * d + 1, format!("device {d} comm")),
        ] {
            events.push(json!({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": name}}));
            events.push(json!({"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}));
        }
    }
    events.push(json!({"ph": "M", "pid": 0, "name": "process_name", "args": {"name": format!("pipewright {}", timeline.meta.schedule)}}));
    let mut sends: HashMap<Action, &Event> = HashMap::new();
    for e in &timeline.events {
        events.push(slice(e, scale));
        if matches!(e.action.kind, ActionKind::SendF | ActionKind::SendB) {
            sends.insert(e.action, e);
        }
    }
    let mut flow_id = 0u64;
    for recv in timeline
        .events
        .iter()
        .filter(|e| matches!(e.action.kind, ActionKind::RecvF | ActionKind::RecvB))
    {
        let Some(send) = recv.action.counterpart().and_then(|a| sends.get(&a)) else {
            continue;
        };
        flow_id += 1;
        let common = json!({"name": "p2p", "cat": "p2p", "id": flow_id, "pid": 0});
        events.push(flow(&common, "s", tid(send), send.start * scale));
        let mut end = flow(
            &common,
            "f",
            tid(recv),
            (recv.start + recv.end) / 2.0 * scale,
        );
        end["bp"] = json!("e");
        events.push(end);
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

fn tid(e: &Event) -> u32 {
    2 * e.device + u32::from(e.action.kind.is_comm())
}

fn slice(e: &Event, scale: f64) -> Value {
    json!({
        "ph": "X", "pid": 0, "tid": tid(e),
        "name": e.action.to_string(), "cat": e.action.kind.as_str(),
        "ts": e.start * scale, "dur": e.duration() * scale,
        "args": {"stage": e.action.stage, "microbatch": e.action.microbatch},
    })
}

fn flow(common: &Value, ph: &str, tid: u32, ts: f64) -> Value {
    let mut v = common.clone();
    v["ph"] = json!(ph);
    v["tid"] = json!(tid);
    v["ts"] = json!(ts);
    v
}
