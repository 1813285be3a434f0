use super::*;
use crate::spec::{ScheduleKind, ScheduleSpec};
use ActionKind::{B, F, I, R, W};

fn peaks(kind: ScheduleKind, p: u32, m: u32) -> Vec<u32> {
    let tt = crate::generate(&ScheduleSpec::new(kind, p, 1, m, None).unwrap());
    tt.devices.iter().map(|row| peak_in_flight(row)).collect()
}

fn changes(row: &[Action]) -> Vec<(usize, Change)> {
    let mut out = Vec::new();
    walk(row, |i, _, c| out.push((i, c)));
    out
}

#[test]
fn in_flight_peaks_follow_the_closed_forms() {
    for (p, m) in [(4, 8), (4, 2), (6, 18), (3, 3)] {
        // 1F1B: device r holds min(p - r, m); GPipe holds every microbatch.
        let want: Vec<u32> = (0..p).map(|r| (p - r).min(m)).collect();
        assert_eq!(
            peaks(ScheduleKind::OneFOneB, p, m),
            want,
            "1F1B p={p} m={m}"
        );
        assert_eq!(
            peaks(ScheduleKind::GPipe, p, m),
            vec![m; p as usize],
            "GPipe"
        );
    }
    // ZB-H1 (Qi et al.): worker i holds p - i + 1 whole stashes and i - 1 awaiting W, so p
    // microbatch-stages in flight on every device.
    assert_eq!(peaks(ScheduleKind::ZbH1, 6, 18), vec![6; 6]);
}

#[test]
fn a_named_recompute_rebuilds_at_its_r_and_its_stage_keeps_the_others_whole() {
    let a = Action::new;
    let row = [a(0, F, 0), a(0, F, 1), a(0, R, 0), a(0, B, 0), a(0, B, 1)];
    use Change::*;
    use Form::*;
    assert_eq!(
        changes(&row),
        [
            (0, Stash(Named)),
            (1, Stash(Whole)),
            (2, Rebuild(Named)),
            (3, Free(Named)),
            (4, Free(Whole)),
        ]
    );
}

#[test]
fn without_r_the_backward_rebuilds_and_a_split_holds_until_w() {
    let a = Action::new;
    // Stage 1 has an R elsewhere in the row; stage 0 recomputes by policy alone.
    let row = [
        a(0, F, 0),
        a(1, F, 0),
        a(1, R, 0),
        a(0, I, 0),
        a(1, B, 0),
        a(0, W, 0),
    ];
    use Change::*;
    use Form::*;
    assert_eq!(
        changes(&row),
        [
            (0, Stash(Policy)),
            (1, Stash(Named)),
            (2, Rebuild(Named)),
            (3, Rebuild(Policy)),
            (3, Split(Policy)),
            (4, Free(Named)),
            (5, FreeWeight),
        ]
    );
    // In flight: 1, 2, 2, 2, 1, 0: the split microbatch-stage counts until its W.
    assert_eq!(peak_in_flight(&row), 2);
}

#[test]
fn an_overlap_is_its_f_then_its_b_and_wide_keys_walk_alike() {
    let a = Action::new;
    let overlap = |s, mb, bs, bmb| {
        Action::new(
            s,
            ActionKind::Overlap {
                b_stage: bs,
                b_microbatch: bmb,
            },
            mb,
        )
    };
    let small = [
        a(0, F, 0),
        a(1, R, 0),
        overlap(1, 0, 0, 0),
        a(1, R, 0),
        a(1, B, 0),
    ];
    // The same row with microbatch numbers far apart: a map, not a table, keeps the flags.
    let big = 3_000_000_000;
    let wide = [
        a(0, F, big),
        a(1, R, 0),
        overlap(1, 0, 0, big),
        a(1, R, 0),
        a(1, B, 0),
    ];
    assert!(matches!(Keys::new(&small), Keys::Dense { .. }));
    assert!(matches!(Keys::new(&wide), Keys::Sparse { .. }));
    use Change::*;
    use Form::*;
    let want = [
        (0, Stash(Policy)),
        // An R before its F finds nothing slim to rebuild; the second one does.
        (2, Stash(Named)),
        (2, Rebuild(Policy)),
        (2, Free(Policy)),
        (3, Rebuild(Named)),
        (4, Free(Named)),
    ];
    assert_eq!(changes(&small), want);
    assert_eq!(changes(&wide), want);
}
