//! Closed forms of DESIGN.md, over the grid: uniform costs B = 2F, no communication.

use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, SpecError};
use pipewright_sim::{simulate, CostModel, StageCost};

const PS: [u32; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 16];

fn run(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Result<pipewright_sim::Report, SpecError> {
    let spec = ScheduleSpec::new(kind, p, v, m, None)?;
    let tt = Checked::new(generate(&spec)).unwrap();
    let costs = CostModel::uniform(spec.stages(), StageCost::new(1.0, 2.0, None).unwrap());
    Ok(simulate(&tt, &costs)
        .expect("generated timetables simulate")
        .report)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1() {
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for p in PS {
            for m in 1..=64 {
                let r = run(kind, p, 1, m).unwrap();
                let want = f64::from(p - 1) / f64::from(m + p - 1);
                assert!(
                    close(r.bubble_fraction, want),
                    "{kind} p={p} m={m}: {} != {want}",
                    r.bubble_fraction
                );
                assert!(
                    close(r.makespan, 3.0 * f64::from(m + p - 1)),
                    "{kind} p={p} m={m}"
                );
            }
        }
    }
}

#[test]
fn interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1_for_every_accepted_m() {
    let mut accepted = 0;
    for v in [1, 2, 4] {
        for p in PS {
            for m in 1..=64 {
                let r = match run(ScheduleKind::Interleaved1F1B, p, v, m) {
                    Ok(r) => r,
                    Err(SpecError::TooFewMicrobatches { .. }) if m < p && v > 1 => continue,
                    Err(e) => panic!("p={p} v={v} m={m} rejected: {e}"),
                };
                accepted += 1;
                let want = f64::from(p - 1) / f64::from(v * m + p - 1);
                assert!(
                    close(r.bubble_fraction, want),
                    "v={v} p={p} m={m}: {} != {want}",
                    r.bubble_fraction
                );
            }
        }
    }
    assert!(accepted > 1500, "{accepted}");
}

#[test]
fn peak_activations_1f1b_is_min_p_minus_r_m_and_gpipe_is_m() {
    for p in PS {
        for m in 1..=64 {
            let one = run(ScheduleKind::OneFOneB, p, 1, m).unwrap();
            let gp = run(ScheduleKind::GPipe, p, 1, m).unwrap();
            for r in 0..p {
                assert_eq!(
                    one.devices[r as usize].peak_activations,
                    (p - r).min(m),
                    "1f1b p={p} m={m} r={r}"
                );
                assert_eq!(
                    gp.devices[r as usize].peak_activations, m,
                    "gpipe p={p} m={m} r={r}"
                );
            }
        }
    }
}
