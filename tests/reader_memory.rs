//! No reader allocates more than a bounded multiple of its input (issue 25, class 3): the
//! numbers a file names (microbatch 268435455, 200,000,000 microbatches, 4,000,000,000
//! devices) are checked against what the file holds before any table is built by them.
//! A counting allocator measures each reader's peak on this thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pipewright::schedule::{
    from_csv, generate, simulate, validate, Checked, CostModel, Report, ScheduleKind, ScheduleSpec,
    StageCost, Timeline, Timetable,
};
use proptest::prelude::*;

thread_local! {
    static NOW: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    let _ = NOW.try_with(|now| {
        let v = now.get() + n;
        now.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn sub(n: usize) {
    let _ = NOW.try_with(|now| now.set(now.get().saturating_sub(n)));
}

/// The system allocator, counting this thread's bytes in use and their peak.
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            sub(layout.size());
            add(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes `f` allocated at its peak beyond what was in use when it started.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = NOW.with(Cell::get);
    PEAK.with(|p| p.set(base));
    f();
    PEAK.with(Cell::get) - base
}

/// What a reader may take: a multiple of its input, plus a constant.
fn bound(input: &str) -> usize {
    64 * input.len() + (1 << 20)
}

/// A JSON timetable reader and the validator over it.
fn read_timetable_json(text: &str) {
    if let Ok(tt) = serde_json::from_str::<Timetable>(text) {
        let _ = validate(&tt);
    }
}

/// The CSV reader and the validator over it.
fn read_timetable_csv(text: &str) {
    if let Ok((tt, _)) = from_csv(text) {
        let _ = validate(&tt);
    }
}

/// A timeline reader, its check, and the report drawn from a timeline that passes.
fn read_timeline(text: &str) {
    if let Ok(tl) = serde_json::from_str::<Timeline>(text) {
        if tl.check().is_ok() {
            let costs = CostModel::uniform(tl.meta.stages, StageCost::new(1.0, 2.0, None).unwrap());
            let _ = Report::new(&tl, &costs);
        }
    }
}

fn number() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..8,
        Just(268_435_455),
        Just(200_000_000),
        Just(u32::MAX),
        any::<u32>()
    ]
}

fn kind() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("F"),
        Just("B"),
        Just("I"),
        Just("W"),
        Just("R"),
        Just("SEND_F"),
        Just("RECV_B")
    ]
}

fn action_json() -> impl Strategy<Value = String> {
    (number(), kind(), number())
        .prop_map(|(s, k, m)| format!(r#"{{"stage":{s},"kind":"{k}","microbatch":{m}}}"#))
}

fn timetable_json() -> impl Strategy<Value = String> {
    (
        number(),
        prop::collection::vec(0u32..4, 0..4),
        prop::collection::vec(prop::collection::vec(action_json(), 0..6), 0..4),
    )
        .prop_map(|(m, placement, rows)| {
            let rows: Vec<String> = rows.iter().map(|r| format!("[{}]", r.join(","))).collect();
            format!(
                r#"{{"microbatches":{m},"stage_device":{placement:?},"devices":[{}]}}"#,
                rows.join(",")
            )
        })
}

fn csv() -> impl Strategy<Value = String> {
    let stage = prop_oneof![0u32..8, Just(268_435_455), Just(4_000_000_000)];
    let cell = (stage, kind(), number()).prop_map(|(s, k, m)| format!("{s}{k}{m}"));
    prop::collection::vec(prop::collection::vec(cell, 1..6), 1..4).prop_map(|rows| {
        rows.iter()
            .map(|r| r.join(","))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

fn timeline_json() -> impl Strategy<Value = String> {
    let event = (0u32..4, action_json(), -2.0f64..10.0, 0.0f64..3.0).prop_map(|(d, a, s, len)| {
        format!(
            r#"{{"device":{d},"action":{a},"start":{s},"end":{}}}"#,
            s + len
        )
    });
    (
        prop_oneof![0u32..4, Just(65_536), Just(4_000_000_000)],
        number(),
        number(),
        prop::collection::vec(event, 0..8),
    )
        .prop_map(|(devices, stages, m, events)| {
            format!(
                r#"{{"meta":{{"schedule":"x","devices":{devices},"stages":{stages},"microbatches":{m},"source":"simulated","time_unit":"units"}},"events":[{}]}}"#,
                events.join(",")
            )
        })
}

/// Real files, which the readers accept whole: a timetable and its timeline.
fn real(p: u32, m: u32) -> (String, String, String) {
    let spec = ScheduleSpec::new(ScheduleKind::ZbH1, p, 1, m, None).unwrap();
    let tt = generate(&spec);
    let costs = CostModel::uniform(p, StageCost::new(1.0, 2.0, None).unwrap());
    let tl = simulate(&Checked::new(tt.clone()).unwrap(), &costs)
        .unwrap()
        .timeline;
    (
        serde_json::to_string(&tt).unwrap(),
        pipewright::schedule::to_csv(&tt),
        serde_json::to_string(&tl).unwrap(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_reader_allocates_beyond_a_multiple_of_its_input(
        tt in timetable_json(),
        rows in csv(),
        tl in timeline_json(),
    ) {
        for (text, read) in [
            (&tt, read_timetable_json as fn(&str)),
            (&rows, read_timetable_csv),
            (&tl, read_timeline),
        ] {
            let peak = peak_of(|| read(text));
            prop_assert!(peak <= bound(text), "{peak} bytes for {} bytes: {text}", text.len());
        }
    }

    #[test]
    fn whole_files_are_read_within_the_same_bound(p in 1u32..6, m in 1u32..40) {
        let (tt, rows, tl) = real(p, m);
        for (text, read) in [
            (&tt, read_timetable_json as fn(&str)),
            (&rows, read_timetable_csv),
            (&tl, read_timeline),
        ] {
            let peak = peak_of(|| read(text));
            prop_assert!(peak <= bound(text), "{peak} bytes for {} bytes", text.len());
        }
    }
}
