//! Every generated timetable validates, lowers, and round-trips through CSV and JSON unchanged.

use pipewright_schedule::Checked;
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

/// Per-device (peak count, peak bytes) of a simulation under uniform costs `f, b`.
fn peaks(tt: &Timetable, devices: u32, f: f64, b: f64) -> Vec<(u32, u64)> {
    let mut cost = pipewright_sim::StageCost::new(f, b, None).unwrap();
    cost.activation_bytes = 1000;
    let model = pipewright_sim::CostModel::uniform(tt.num_stages(), cost.split(1));
    let sim = pipewright_sim::simulate(&Checked::new(tt.clone()).unwrap(), &model).unwrap();
    assert_eq!(sim.report.devices.len(), devices as usize);
    sim.report
        .devices
        .iter()
        .map(|d| (d.peak_activations, d.peak_activation_bytes))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A device runs its actions in order, so its peak cannot depend on how long they take:
    /// zero costs (every action at time 0) peak exactly as tiny and ordinary ones do (the
    /// search's untimed count agrees: `pipewright-search`'s `stash_agree`).
    #[test]
    fn memory_peaks_follow_action_order_whatever_the_costs(spec in spec()) {
        let tt = generate(&spec);
        let zero = peaks(&tt, spec.devices(), 0.0, 0.0);
        prop_assert_eq!(&zero, &peaks(&tt, spec.devices(), 1e-9, 2e-9));
        prop_assert_eq!(&zero, &peaks(&tt, spec.devices(), 1.0, 2.0));
        for (d, &(count, bytes)) in zero.iter().enumerate() {
            prop_assert_eq!(bytes, u64::from(count) * 1000, "device {}", d);
            prop_assert!(count >= 1, "device {} holds no activation at all", d);
        }
    }
}
