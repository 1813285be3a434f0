//! Under Megatron's accounting, a microbatch its stage does not recompute (while an `R`
//! recomputes another) keeps its whole stash: one `R` can only lower a peak by what it
//! drops, never below the microbatches that stay whole.

use pipewright_model::memory::{predict, Accounting, MemoryConfig, ModelShape};
use pipewright_schedule::{generate, Action, ActionKind, ScheduleKind, ScheduleSpec};

#[test]
fn one_recomputed_microbatch_leaves_the_others_whole() {
    let shape = ModelShape::gpt(8, 256, 8, 1024, 128, 1024);
    // 1F1B, p = 2: device 0 holds microbatches 0 and 1 when 0's backward starts.
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let mut one = tt.clone();
    let row = &mut one.devices[0];
    let at = row
        .iter()
        .position(|a| a.kind == ActionKind::B && a.microbatch == 0)
        .unwrap();
    row.insert(at, Action::new(0, ActionKind::R, 0));
    for accounting in [Accounting::Megatron, Accounting::Pipewright] {
        let cfg = MemoryConfig::new(shape, 2).with_accounting(accounting);
        let none = predict(&cfg, &tt).unwrap()[0].activations;
        let with_r = predict(&cfg, &one).unwrap()[0].activations;
        // Two whole stashes at the peak without it; with it, microbatch 1 is still whole.
        assert!(with_r <= none, "{accounting:?}: {with_r} > {none}");
        assert!(
            2 * with_r >= none,
            "{accounting:?}: {with_r} < half of {none}"
        );
    }
}
