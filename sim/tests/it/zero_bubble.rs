//! Closed forms of the looped-BFS and zero-bubble families, as simulated.
//!
//! Costs are per stage: forward `F`, input gradient `I`, weight gradient `W` (our full
//! backward `B = I + W`; the zero-bubble paper's `B` is our `I`). The bubble in time is
//! `makespan - ideal`, ideal being the busiest device's compute time.

use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, SpecError};
use pipewright_sim::{simulate, CostModel, Report, StageCost};

const PS: [u32; 8] = [1, 2, 3, 4, 5, 6, 8, 16];

fn report(
    kind: ScheduleKind,
    p: u32,
    v: u32,
    m: u32,
    (f, i, w, c): (f64, f64, f64, f64),
) -> Report {
    let spec = ScheduleSpec::new(kind, p, v, m, None).unwrap();
    let costs = CostModel::uniform(spec.stages(), StageCost::new(f, i + w, Some(w)).unwrap())
        .with_link(c, None)
        .unwrap();
    simulate(&Checked::new(generate(&spec)).unwrap(), &costs)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .report
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() < 1e-9, "{what}: {got} != {want}");
}

const UNIT: (f64, f64, f64, f64) = (1.0, 1.0, 1.0, 0.0);

#[test]
fn looped_bfs_bubble_is_interleavings_and_memory_is_gpipes() {
    for v in [1, 2, 3, 4] {
        for p in PS {
            for m in p..=p + 20 {
                let r = report(ScheduleKind::LoopedBfs, p, v, m, (1.0, 1.0, 1.0, 0.0));
                let want = f64::from(p - 1) / f64::from(v * m + p - 1);
                assert_close(r.bubble_fraction, want, &format!("p={p} v={v} m={m}"));
                for d in &r.devices {
                    assert_eq!(d.peak_activations, v * m, "p={p} v={v} m={m}");
                }
            }
        }
    }
}

#[test]
fn zb_h1_bubble_is_p_minus_1_times_f_plus_i_minus_w_with_1f1b_memory() {
    // F = I = W = 1 (full B = 2) as the issue asks, and two uneven splits with W <= F.
    for costs in [UNIT, (1.0, 2.0, 0.5, 0.0), (2.0, 1.5, 1.0, 0.0)] {
        let (f, i, w, _) = costs;
        for p in PS {
            for m in p..=p + 24 {
                let r = report(ScheduleKind::ZbH1, p, 1, m, costs);
                let what = format!("p={p} m={m} costs={costs:?}");
                assert_close(r.makespan - r.ideal, f64::from(p - 1) * (f + i - w), &what);
                assert_close(r.ideal, f64::from(m) * (f + i + w), &what);
                for d in &r.devices {
                    assert_eq!(d.peak_activations, p, "{what}");
                }
            }
        }
    }
}

#[test]
fn zb_h2_bubble_is_the_papers_or_the_start_up_skew_with_2p_minus_1_memory() {
    let costs = [
        UNIT,
        (1.0, 2.0, 0.5, 0.0),
        (1.0, 1.0, 0.5, 0.0),
        (1.0, 2.0, 0.5, 0.25),
        (1.0, 1.0, 1.0, 0.25),
    ];
    for costs in costs {
        let (f, i, w, c) = costs;
        let per_hop = (f + c).max(f + i + 2.0 * c - 2.0 * w);
        for p in PS {
            for m in 2 * p - 1..=2 * p + 20 {
                let r = report(ScheduleKind::ZbH2, p, 1, m, costs);
                let what = format!("p={p} m={m} costs={costs:?}");
                assert_close(r.makespan - r.ideal, f64::from(p - 1) * per_hop, &what);
                for d in &r.devices {
                    assert_eq!(d.peak_activations, 2 * p - 1, "{what}");
                }
            }
        }
    }
}

#[test]
fn zbv_bubble_is_only_the_start_up_skew_when_f_i_w_are_equal() {
    for p in PS {
        for m in 2 * p - 1..=2 * p + 24 {
            let r = report(ScheduleKind::Zbv, p, 2, m, UNIT);
            let what = format!("p={p} m={m}");
            assert_close(r.makespan - r.ideal, f64::from(p - 1), &what);
            assert_close(r.ideal, 6.0 * f64::from(m), &what);
            let want = f64::from(p - 1) / f64::from(6 * m + p - 1);
            assert_close(r.bubble_fraction, want, &what);
            // 2p chunk-microbatches = p microbatches of a device's two chunks together.
            for d in &r.devices {
                assert_eq!(d.peak_activations, 2 * p, "{what}");
            }
        }
    }
}

#[test]
fn zero_bubble_families_beat_1f1b_for_the_same_memory() {
    for p in [2, 4, 8] {
        let m = 4 * p;
        let one = report(ScheduleKind::OneFOneB, p, 1, m, UNIT);
        let h1 = report(ScheduleKind::ZbH1, p, 1, m, UNIT);
        assert!(h1.makespan < one.makespan, "p={p}");
        assert_eq!(h1.peak_activations(), one.peak_activations());
    }
}

#[test]
fn v_shapes_need_exactly_two_chunks_and_say_so() {
    for v in [1, 3] {
        let e = ScheduleSpec::new(ScheduleKind::Zbv, 4, v, 8, None).unwrap_err();
        assert_eq!(
            e,
            SpecError::VShapeNeedsTwo {
                kind: ScheduleKind::Zbv,
                v
            }
        );
        assert!(
            e.to_string().contains(&format!("so v must be 2 (got {v})")),
            "{e}"
        );
    }
    let spec = ScheduleSpec::new(ScheduleKind::Zbv, 3, 2, 4, None).unwrap();
    assert_eq!(generate(&spec).stage_device, vec![0, 1, 2, 2, 1, 0]);
    for kind in [ScheduleKind::ZbH1, ScheduleKind::ZbH2] {
        assert!(matches!(
            ScheduleSpec::new(kind, 4, 2, 8, None),
            Err(SpecError::VirtualUnsupported { .. })
        ));
    }
    assert!(ScheduleSpec::new(ScheduleKind::LoopedBfs, 4, 3, 2, None).is_ok());
}

#[test]
fn new_names_parse() {
    for (name, kind) in [
        ("looped-bfs", ScheduleKind::LoopedBfs),
        ("zb-h1", ScheduleKind::ZbH1),
        ("zb-h2", ScheduleKind::ZbH2),
        ("ZBV", ScheduleKind::Zbv),
    ] {
        assert_eq!(name.parse::<ScheduleKind>().unwrap(), kind);
    }
}
