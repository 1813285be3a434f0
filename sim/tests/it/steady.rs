//! Steady state: the period never exceeds the single-step makespan, equals it for GPipe, and
//! is at least the busiest device's compute.

use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
use pipewright_sim::simulate::simulate_steps;
use pipewright_sim::{CostModel, StageCost};
use proptest::prelude::*;

fn spec() -> impl Strategy<Value = ScheduleSpec> {
    (
        0usize..ScheduleKind::ALL.len(),
        1u32..=6,
        1u32..=3,
        1u32..=16,
    )
        .prop_filter_map("schedulable", |(k, p, v, m)| {
            let kind = ScheduleKind::ALL[k];
            let v = match kind.fixed_virtual() {
                Some(fixed) => fixed,
                None if kind.supports_virtual() => v,
                None => 1,
            };
            ScheduleSpec::new(kind, p, v, m, None).ok()
        })
}

fn costs(stages: u32, f: f64, b: f64, w_frac: f64, c: f64, skew: f64) -> CostModel {
    let mut model = CostModel::uniform(stages, StageCost::new(f, b, Some(b * w_frac)).unwrap());
    // One heavier stage, so non-uniform costs are covered too.
    if let Some(last) = model.stages.last_mut() {
        last.f *= skew;
        last.b *= skew;
        last.i *= skew;
        last.w *= skew;
    }
    model.with_link(c, None).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_period_is_between_the_ideal_and_the_makespan(
        spec in spec(), f in 0.5f64..2.0, b in 0.5f64..3.0, w_frac in 0.1f64..0.9,
        c in prop_oneof![Just(0.0), 0.0f64..0.3], skew in 1.0f64..2.0, k in 3u32..=5,
    ) {
        let model = costs(spec.stages(), f, b, w_frac, c, skew);
        let s = simulate_steps(&Checked::new(generate(&spec)).unwrap(), &model, k).unwrap().report;
        let eps = 1e-9 * s.single_step_makespan.max(1.0);
        prop_assert!(s.period <= s.single_step_makespan + eps, "{spec}: {s:?}");
        prop_assert!(s.period >= s.ideal - eps, "{spec}: {s:?}");
        prop_assert!(s.bubble.steady_state <= s.bubble.single_step + 1e-9);
        if spec.kind() == ScheduleKind::GPipe {
            prop_assert!((s.period - s.single_step_makespan).abs() <= eps, "{spec}: {s:?}");
        }
    }
}
