//! Every generated timetable validates, lowers, and round-trips through CSV and JSON unchanged.

use pipewright_schedule::{
    from_csv, generate, lower, to_csv, validate, ActionKind, ScheduleKind, ScheduleSpec, Timetable,
};
use proptest::prelude::*;

fn spec() -> impl Strategy<Value = ScheduleSpec> {
    (
        0usize..ScheduleKind::ALL.len(),
        1u32..=9,
        prop_oneof![Just(1u32), Just(2), Just(3), Just(4)],
        1u32..=40,
        0u32..=12,
    )
        .prop_filter_map("schedulable", |(k, p, v, m, g)| {
            let kind = ScheduleKind::ALL[k];
            let v = match kind.fixed_virtual() {
                Some(fixed) => fixed,
                None if kind.supports_virtual() => v,
                None => 1,
            };
            let g = (kind == ScheduleKind::Interleaved1F1B && g >= p).then_some(g);
            ScheduleSpec::new(kind, p, v, m, g).ok()
        })
}

fn same_content(a: &Timetable, b: &Timetable) {
    assert_eq!(a.devices, b.devices);
    assert_eq!(a.stage_device, b.stage_device);
    assert_eq!(a.microbatches, b.microbatches);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn generated_timetables_validate_lower_and_round_trip(spec in spec()) {
        let tt = generate(&spec);
        // F and B per stage-microbatch, or F, I and W where the backward is split; an
        // F&B overlap counts as its two parts.
        let parts: Vec<_> = tt.devices.iter().flatten().flat_map(|a| a.parts()).collect();
        let splits = parts.iter().filter(|a| a.kind == ActionKind::W).count() as u32;
        prop_assert_eq!(parts.len() as u32, 2 * spec.stages() * spec.microbatches() + splits);
        let v = validate(&tt).map_err(|e| TestCaseError::fail(format!("{spec}: {e}")))?;
        prop_assert!(!v.lowered);

        let low = lower(&tt).unwrap();
        let lv = validate(&low).map_err(|e| TestCaseError::fail(format!("{spec} lowered: {e}")))?;
        prop_assert!(lv.lowered || spec.devices() == 1);
        prop_assert_eq!(low.compute_only(), tt.clone());

        for t in [&tt, &low] {
            let (back, _) = from_csv(&to_csv(t)).unwrap();
            same_content(&back, t);
            let json = serde_json::to_string(t).unwrap();
            let back: Timetable = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(&back, t);
        }
        let spec_json = serde_json::to_string(&spec).unwrap();
        prop_assert!(spec_json.contains(spec.kind().name()));
    }
}
