//! Terminal rendering: one line per device, one character per time bucket.

use pipewright_schedule::{ActionKind, Event, Timeline};

use crate::bubble::params;
use crate::lanes::{chunks_per_device, row_count, split_lanes};
use crate::style::format_number;

/// Narrowest layout we draw; a smaller `columns` is raised to this.
pub const MIN_COLUMNS: usize = 24;
/// Width of the bubble column at each line's end: ` 100.0%`.
const PCT_W: usize = 7;

/// Render `timeline` as plain text whose every line fits in `columns` characters
/// (at least [`MIN_COLUMNS`]).
///
/// Each device line shows, per time bucket, the compute kind that covers most of it:
/// `F`, `B`, `I`, `W` for chunk 0, 2, … and `f`, `b`, `i`, `w` for chunk 1, 3, … (chunk =
/// `stage / p`), so alternating chunks stay apart; `.` is a bucket that is mostly idle. The
/// line ends with the device's bubble percentage; a legend line closes the chart.
/// Communication is left out: at terminal resolution it would hide the compute.
pub fn terminal_chart(timeline: &Timeline, columns: usize) -> String {
    let columns = columns.max(MIN_COLUMNS);
    let rows = row_count(timeline);
    let label_w = format!("dev {}", rows.saturating_sub(1)).len() + 1;
    let body = columns - label_w - 2 - PCT_W;
    let start = if timeline.events.is_empty() {
        0.0
    } else {
        timeline.start()
    };
    let span = (timeline.makespan() - start).max(0.0);
    let mut out = Vec::new();
    out.push(fit(&header(timeline, span), columns));
    let bubbles = timeline.bubble_per_device();
    let chunks = chunks_per_device(timeline);
    for (d, lane) in split_lanes(timeline, rows).iter().enumerate() {
        let cells = buckets(
            &lane.compute,
            start,
            span,
            body,
            timeline.meta.devices,
            chunks,
        );
        let pct = bubbles
            .get(d)
            .map_or(String::new(), |b| format!("{:.1}%", 100.0 * b));
        let label = format!("dev {d}");
        out.push(format!(
            "{}|{cells}|{}",
            pad_left(&label, label_w - 1),
            pad_left(&pct, PCT_W)
        ));
    }
    out.push(axis(label_w, body, span, &timeline.meta.time_unit));
    out.extend(legend(columns, chunks > 1));
    let mut s = out.join("\n");
    s.push('\n');
    s
}

/// `interleaved-1f1b p=4 v=2 m=8 simulated · makespan 32 units · bubble 25.0%`.
fn header(tl: &Timeline, span: f64) -> String {
    let source = match tl.meta.source {
        pipewright_schedule::TimelineSource::Simulated => "simulated",
        pipewright_schedule::TimelineSource::Measured => "measured",
    };
    format!(
        "{} {} {source} · makespan {} {} · bubble {:.1}%",
        tl.meta.schedule,
        params(tl),
        format_number(span),
        tl.meta.time_unit,
        100.0 * tl.bubble_fraction()
    )
}

/// Cut a line to `columns` characters (not bytes: the header has a `·`).
fn fit(s: &str, columns: usize) -> String {
    s.chars().take(columns).collect()
}

/// Slot of a compute action in the per-bucket tallies: kind × chunk parity.
fn slot(kind: ActionKind, chunk: u32) -> usize {
    let k = match kind {
        ActionKind::F => 0,
        ActionKind::B => 1,
        ActionKind::I => 2,
        ActionKind::R => 4,
        _ => 3,
    };
    k * 2 + (chunk % 2) as usize
}

const GLYPHS: [char; 10] = ['F', 'f', 'B', 'b', 'I', 'i', 'W', 'w', 'R', 'r'];

/// Characters of one device line: for each of `n` buckets the slot covering most of it, or
/// `.` when compute covers less than half of it.
fn buckets(
    events: &[&Event],
    start: f64,
    span: f64,
    n: usize,
    devices: u32,
    chunks: u32,
) -> String {
    if span <= 0.0 || n == 0 {
        return ".".repeat(n);
    }
    let bw = span / n as f64;
    let mut tally = vec![[0.0f64; GLYPHS.len()]; n];
    for e in events {
        let chunk = e.action.stage.checked_div(devices).unwrap_or(0).min(chunks);
        let s = slot(e.action.kind, chunk);
        let (a, b) = (e.start - start, e.end - start);
        let first = ((a / bw).floor().max(0.0) as usize).min(n - 1);
        let last = ((b / bw).ceil().max(0.0) as usize).min(n);
        for (i, t) in tally.iter_mut().enumerate().take(last).skip(first) {
            let (lo, hi) = (i as f64 * bw, (i + 1) as f64 * bw);
            t[s] += (b.min(hi) - a.max(lo)).max(0.0);
        }
    }
    tally
        .iter()
        .map(|t| {
            let busy: f64 = t.iter().sum();
            let (best, _) =
                t.iter().enumerate().fold(
                    (0, 0.0),
                    |acc, (i, v)| if *v > acc.1 { (i, *v) } else { acc },
                );
            if busy < bw / 2.0 {
                '.'
            } else {
                GLYPHS[best]
            }
        })
        .collect()
}

/// `      0 ....................... 32 units` under the body.
fn axis(label_w: usize, body: usize, span: f64, unit: &str) -> String {
    let end = format!("{} {unit}", format_number(span));
    let room = (body + 1).saturating_sub(end.len() + 1);
    let end = if room == 0 { String::new() } else { end };
    format!("{}0{}", " ".repeat(label_w), pad_left(&end, body))
}

/// `s` right-aligned in `width` characters. Built by hand: `format!`'s runtime widths stop
/// at 65535, and a chart may be wider.
fn pad_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(width.saturating_sub(n)))
}

/// Legend, wrapped to `columns`.
fn legend(columns: usize, chunked: bool) -> Vec<String> {
    let mut items = vec![
        "F forward",
        "B backward",
        "I backward-input",
        "W backward-weight",
        ". idle",
    ];
    if chunked {
        items.push("lower case: odd chunk");
    }
    let mut lines = vec![String::new()];
    for it in items {
        let cur = lines.last_mut().map_or(0, |l| l.chars().count());
        if cur > 0 && cur + 2 + it.len() > columns {
            lines.push(String::new());
        }
        if let Some(l) = lines.last_mut() {
            if !l.is_empty() {
                l.push_str("  ");
            }
            l.push_str(&fit(it, columns));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::{Action, TimelineMeta, TimelineSource};

    fn tl(events: Vec<Event>) -> Timeline {
        Timeline {
            meta: TimelineMeta {
                schedule: "t".into(),
                devices: 1,
                stages: 1,
                microbatches: 1,
                source: TimelineSource::Simulated,
                time_unit: "units".into(),
            },
            events,
        }
    }

    #[test]
    fn buckets_follow_time() {
        let ev = |k, s, e| Event {
            device: 0,
            action: Action::new(0, k, 0),
            start: s,
            end: e,
        };
        let t = tl(vec![
            ev(ActionKind::F, 0.0, 1.0),
            ev(ActionKind::B, 2.0, 4.0),
        ]);
        let refs: Vec<&Event> = t.events.iter().collect();
        assert_eq!(buckets(&refs, 0.0, 4.0, 8, 1, 1), "FF..BBBB");
    }

    #[test]
    fn any_width_draws_without_a_panic() {
        let ev = Event {
            device: 0,
            action: Action::new(0, ActionKind::F, 0),
            start: 0.0,
            end: 1.0,
        };
        for columns in [0, 1, 24, 70_000, 200_000] {
            let s = terminal_chart(&tl(vec![ev]), columns);
            let widest = s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            assert!(widest <= columns.max(MIN_COLUMNS), "{columns}: {widest}");
        }
    }

    #[test]
    fn empty_timeline_draws_idle_lines() {
        let s = terminal_chart(&tl(vec![]), 40);
        assert!(s.lines().all(|l| l.chars().count() <= 40), "{s}");
        assert!(s.contains("dev 0|"));
    }
}
