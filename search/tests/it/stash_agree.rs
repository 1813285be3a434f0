//! The simulator's report (bytes, timed) and the search's units (in order) weigh one stash
//! walk: on every family, with recomputation named for some microbatches of a stage and split
//! backwards that keep part of the stash until W, their per-device peaks are equal.

use pipewright_schedule::action::ActionKind;
use pipewright_schedule::recompute::{insert, Recompute, RecomputePlan};
use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
use pipewright_search::{held_weights, kept_weights, peak_units_kept, stage_weights};
use pipewright_sim::simulate::simulate;
use pipewright_sim::{CostModel, StageCost};

#[test]
fn simulator_and_search_peaks_agree_with_named_recompute_and_split_backwards() {
    let mut checked = 0;
    for kind in ScheduleKind::ALL {
        for (p, v, m) in [(2, 1, 3), (4, 1, 8), (4, 2, 8), (3, 2, 5)] {
            let Ok(spec) = ScheduleSpec::new(kind, p, v, m, None) else {
                continue;
            };
            let base = generate(&spec);
            let stages = base.num_stages();
            // Stages 0 and 2 recompute, but not microbatches 1 and 4: they keep it whole.
            let plan = RecomputePlan {
                stages: [(0, Recompute::Full), (2, Recompute::Full)].into(),
                ..RecomputePlan::default()
            };
            let mut tt = insert(&base, &plan);
            for row in &mut tt.devices {
                row.retain(|a| a.kind != ActionKind::R || !matches!(a.microbatch, 1 | 4));
            }
            let mut c = StageCost::new(1.0, 2.0, Some(1.0)).unwrap();
            c.activation_bytes = 1000;
            c.w_memory = 0.375;
            c.kept_bytes = Some(250);
            let costs = CostModel::uniform(stages, c);
            let weights = stage_weights(&costs, p);
            let held = held_weights(&costs, &weights);
            let kept = kept_weights(&costs, &weights);
            let units = peak_units_kept(&tt, &weights, &held, &kept);
            let unit = 1000.0 * f64::from(v);
            let sim = simulate(&Checked::new(tt.clone()).unwrap(), &costs).unwrap();
            for (d, dev) in sim.report.devices.iter().enumerate() {
                let bytes = dev.peak_activation_bytes as f64 / unit;
                assert!(
                    (bytes - units[d]).abs() < 1e-9,
                    "{kind:?} p={p} v={v} m={m} device {d}: simulator {bytes}, search {}",
                    units[d]
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 16, "{checked}");
}
