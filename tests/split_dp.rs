//! examples/split_dp.rs (a hand-written `StageModule` with a split backward and
//! `flat_grads`) equals one device under split-backward schedules with data parallelism, and
//! a replica count that needs its `flat_grads` would be refused without them.

#[allow(dead_code)]
#[path = "../examples/split_dp.rs"]
mod split_dp;

use pipewright::kernels::optim::AdamWConfig;
use pipewright::runtime::{Mesh, RunOptions};
use pipewright::schedule::{generate, Checked, ScheduleKind, ScheduleSpec};
use split_dp::{close, one_device, train};

#[test]
fn a_split_backward_model_with_dp_equals_one_device() {
    let opts = RunOptions {
        steps: 4,
        adamw: AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    };
    for (kind, v, dp) in [
        (ScheduleKind::ZbH1, 1, 2),
        (ScheduleKind::Zbv, 2, 2),
        (ScheduleKind::Interleaved1F1B, 2, 1),
    ] {
        let tt = Checked::new(generate(&ScheduleSpec::new(kind, 2, v, 4, None).unwrap())).unwrap();
        let what = format!("{} v={v} dp={dp}", tt.name);
        let got = train(Mesh::new(2, 1, dp).unwrap(), &tt, &opts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = one_device(4 * dp as u32, &opts).unwrap();
        assert_eq!(got.len(), 4, "{what}");
        for (step, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(close(*a, *b), "{what}: step {step}: {a} vs one device {b}");
        }
        assert!(want[3] < want[0], "{what}: does not train: {want:?}");
    }
}
