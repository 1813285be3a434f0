//! Activation recomputation changes what a stage keeps, never what it computes: losses and
//! every parameter equal a run without it to the bit, under every schedule family (split I
//! and W included), while the stashes keep exactly the bytes the policy says.

use pipewright_kernels::gpt::GptConfig;
use pipewright_kernels::layers::TpReduce;
use pipewright_kernels::Tensor;
use pipewright_runtime::{
    run, train_gpt, FinalParams, Mesh, MicrobatchData, ModuleError, Output, RunOptions,
    RuntimeError, StageModule, SyntheticModule, TrainConfig,
};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, Recompute, RecomputePlan, ScheduleKind, ScheduleSpec};

const M: u32 = 4;

fn config(mesh: Mesh, plan: &str) -> TrainConfig {
    TrainConfig {
        mesh,
        // vocab 16, seq 8, d_model 16, 2 heads, 8 layers (d_ff = 64).
        model: GptConfig::new(16, 8, 16, 2, 8),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 5,
        run: RunOptions {
            steps: 2,
            recompute: plan.parse().unwrap(),
            ..RunOptions::default()
        },
    }
}

struct Outcome {
    losses: Vec<u32>,
    params: FinalParams,
    peak_bytes: Vec<u64>,
    kept: Vec<u64>,
}

fn train(kind: ScheduleKind, v: u32, mesh: Mesh, plan: &str) -> Outcome {
    let spec = ScheduleSpec::new(kind, mesh.pp as u32, v, M, None).unwrap();
    let tt = generate(&spec);
    let (mut losses, mut peak_bytes, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    let params = train_gpt(
        &config(mesh, plan),
        &Checked::new(tt.clone()).unwrap(),
        |s| {
            losses.push(s.loss.unwrap().to_bits());
            peak_bytes = s.peak_stash_bytes.clone();
            kept = s.kept_per_microbatch.clone();
        },
    )
    .unwrap();
    Outcome {
        losses,
        params,
        peak_bytes,
        kept,
    }
}

fn bits(p: &FinalParams) -> Vec<Vec<u32>> {
    p.values()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn every_policy_trains_bit_identically_under_every_schedule_family() {
    for (kind, v) in [
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Zbv, 2),
    ] {
        let mesh = Mesh::new(2, 1, 1).unwrap();
        let base = train(kind, v, mesh, "none");
        for plan in ["full", "selective", "every:1", "0:full,1:selective"] {
            let got = train(kind, v, mesh, plan);
            assert_eq!(got.losses, base.losses, "{kind:?} {plan}: losses");
            assert_eq!(bits(&got.params), bits(&base.params), "{kind:?} {plan}");
            if plan.contains(':') {
                continue; // stages 2 and 3 of the interleaved and V schedules keep everything
            }
            // Never more, and strictly less on the first device, which holds several
            // microbatches at once (a device holding one at a time rebuilds it whole).
            let (g, b) = (&got.peak_bytes, &base.peak_bytes);
            assert!(
                g.iter().zip(b).all(|(g, b)| g <= b),
                "{kind:?} {plan}: {g:?} {b:?}"
            );
            assert!(g[0] < b[0], "{kind:?} {plan}: peaks {g:?} not below {b:?}");
            let (g, b) = (&got.kept, &base.kept);
            assert!(
                g.iter().zip(b).all(|(g, b)| g < b),
                "{kind:?} {plan}: {g:?} {b:?}"
            );
        }
    }
}

#[test]
fn recomputation_with_tensor_and_data_parallelism_is_bit_identical() {
    let mesh = Mesh::new(2, 2, 2).unwrap();
    let base = train(ScheduleKind::ZbH1, 1, mesh, "none");
    for plan in ["full", "selective", "every:1"] {
        let got = train(ScheduleKind::ZbH1, 1, mesh, plan);
        assert_eq!(got.losses, base.losses, "{plan}");
        assert_eq!(bits(&got.params), bits(&base.params), "{plan}");
    }
}

#[test]
fn recomputation_in_bf16_and_under_zero_1_is_bit_identical_too() {
    use pipewright_kernels::Precision;
    use pipewright_runtime::Zero;
    let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 2, 2, M, None).unwrap();
    let tt = generate(&spec);
    let go = |plan: &str| {
        let mut cfg = config(Mesh::new(2, 1, 2).unwrap(), plan);
        cfg.run.precision = Precision::Bf16;
        cfg.run.zero = Zero::One;
        let mut losses = Vec::new();
        let params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            losses.push(s.loss.unwrap().to_bits())
        })
        .unwrap();
        (losses, bits(&params))
    };
    let base = go("none");
    for plan in ["full", "selective", "every:1"] {
        assert_eq!(go(plan), base, "{plan}");
    }
}

#[test]
fn a_middle_stage_keeps_exactly_the_closed_form_bytes_per_microbatch() {
    // ZBV over 2 devices, 4 stages of 2 layers in a V: device 1 holds stages 1 and 2, both
    // in the middle (no embedding, no head), so a forward keeps per layer, in f32:
    // LayerNorms 2(sbh + sb), attention x, qkv, ctx 5sbh and probabilities a*s*s*b,
    // MLP x sbh and two d_ff-wide tensors 2sbf. Full keeps the input, sbh.
    let (s, b, h, f, a, layers) = (8u64, 2, 16, 64, 2, 2);
    let sbh = s * b * h;
    let selective = layers * 4 * (8 * sbh + 2 * s * b * f + 2 * s * b);
    let none = selective + layers * 4 * a * s * s * b;
    let mesh = Mesh::new(2, 1, 1).unwrap();
    let kept = |plan| train(ScheduleKind::Zbv, 2, mesh, plan).kept[1];
    assert_eq!(kept("none"), none);
    assert_eq!(kept("selective"), selective);
    assert_eq!(kept("full"), 4 * sbh);
    // every:1 reruns the first of the two layers: the input and the second layer's stash.
    assert_eq!(kept("every:1"), 4 * sbh + none / 2);
    assert_eq!(kept("every:2"), 4 * sbh);
}

#[test]
fn a_synthetic_stage_refuses_selective_naming_its_stage_and_a_plan_past_the_stages_is_refused() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 2, None).unwrap());
    let module = |s: u32| SyntheticModule {
        f: Default::default(),
        i: Default::default(),
        w: Default::default(),
        activation: 1,
        last: s == 1,
    };
    let go = |plan: &str| {
        let opts = RunOptions {
            recompute: plan.parse().unwrap(),
            ..RunOptions::default()
        };
        let mesh = Mesh::new(2, 1, 1).unwrap();
        run(
            mesh,
            &Checked::new(tt.clone()).unwrap(),
            |_, s| Ok(module(s)),
            |_| Ok(()),
            &opts,
            |_| {},
        )
    };
    assert!(go("none").is_ok());
    let e = go("1:selective").unwrap_err();
    assert!(matches!(
        e,
        RuntimeError::NoRecompute {
            stage: 1,
            policy: Recompute::Selective,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "stage 1 cannot recompute (selective): a synthetic stage recomputes only fully (it has no layers)"
    );
    let e = go("3:full").unwrap_err().to_string();
    assert_eq!(
        e,
        "timetable: recompute names stage 3, but the timetable has 2 stages"
    );
    assert_eq!(RecomputePlan::default().of(0), Recompute::None);
}

/// A user's module that implements only the required methods.
struct Plain(SyntheticModule);

impl StageModule for Plain {
    type Tensor = Tensor;
    type Data = ();
    type Stash = ();
    type WeightStash = ();

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_>,
        x: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Output, ()), ModuleError> {
        self.0.forward(mb, x, tp)
    }
    fn backward_input(
        &mut self,
        s: (),
        g: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, ()), ModuleError> {
        self.0.backward_input(s, g, tp)
    }
    fn backward_weight(&mut self, s: ()) -> Result<(), ModuleError> {
        self.0.backward_weight(s)
    }
}

#[test]
fn a_module_that_offers_nothing_runs_without_recomputation_and_is_refused_with_it() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 2, None).unwrap());
    let go = |plan: &str| {
        let opts = RunOptions {
            recompute: plan.parse().unwrap(),
            ..RunOptions::default()
        };
        let make = |_, s: u32| {
            Ok(Plain(SyntheticModule {
                f: Default::default(),
                i: Default::default(),
                w: Default::default(),
                activation: 1,
                last: s == 1,
            }))
        };
        run(
            Mesh::new(2, 1, 1).unwrap(),
            &Checked::new(tt.clone()).unwrap(),
            make,
            |_| Ok(()),
            &opts,
            |_| {},
        )
    };
    assert!(go("none").is_ok());
    let e = go("0:full").unwrap_err().to_string();
    assert_eq!(
        e,
        "stage 0 cannot recompute (full): its module offers no full recomputation"
    );
}

fn train_timetable(tt: &pipewright_schedule::Timetable, plan: &str) -> (Vec<u32>, FinalParams) {
    let mut losses = Vec::new();
    let cfg = config(Mesh::new(tt.num_devices() as usize, 1, 1).unwrap(), plan);
    let params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.unwrap().to_bits())
    })
    .unwrap();
    (losses, params)
}

#[test]
fn explicit_r_actions_run_where_the_timetable_puts_them_with_the_same_bits() {
    use pipewright_schedule::recompute::insert;
    use pipewright_schedule::{validate, Action, ActionKind};
    let tt = generate(&ScheduleSpec::new(ScheduleKind::ZbH1, 2, 1, M, None).unwrap());
    let (losses, params) = train_timetable(&tt, "none");
    // R right before each backward; no policy given, so the stages recompute fully.
    let before_backward = insert(&tt, &"full".parse().unwrap());
    let got = train_timetable(&before_backward, "none");
    assert_eq!((got.0, bits(&got.1)), (losses.clone(), bits(&params)));
    // Selective with explicit R; and R as early as it may go, right after its F.
    let got = train_timetable(&before_backward, "selective");
    assert_eq!((got.0, bits(&got.1)), (losses.clone(), bits(&params)));
    let mut early = tt.clone();
    for row in &mut early.devices {
        let mut out = Vec::new();
        for &a in row.iter() {
            out.push(a);
            if a.kind == ActionKind::F {
                out.push(Action::new(a.stage, ActionKind::R, a.microbatch));
            }
        }
        *row = out;
    }
    validate(&early).unwrap();
    let got = train_timetable(&early, "none");
    assert_eq!((got.0, bits(&got.1)), (losses, bits(&params)));
}

#[test]
fn a_timetable_that_recomputes_some_microbatches_keeps_the_others_whole() {
    use pipewright_schedule::{validate, Action, ActionKind, Timetable};
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, M, None).unwrap());
    // Peak stash bytes and the largest one forward's stash, per device.
    let peaks = |tt: &Timetable| {
        let (mut peak, mut kept) = (Vec::new(), Vec::new());
        let cfg = config(Mesh::new(2, 1, 1).unwrap(), "none");
        let params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            peak = s.peak_stash_bytes.clone();
            kept = s.kept_per_microbatch.clone();
        })
        .unwrap();
        (peak, kept, bits(&params))
    };
    let (none, whole, base) = peaks(&tt);
    let all = pipewright_schedule::recompute::insert(&tt, &"0:full".parse().unwrap());
    let (every, slim, got) = peaks(&all);
    assert_eq!(got, base);
    assert!(slim[0] < whole[0]);
    // Device 0 runs F0 F1 B0 F2 B1 F3 B2 B3: microbatch 0 is backwarded while 1 waits, and
    // so on, so recomputing 1, 2 and 3 (not 0) already gives the peak of recomputing all.
    let mut some = tt.clone();
    let row = &mut some.devices[0];
    for mb in 1..M {
        let at = row
            .iter()
            .position(|a| a.kind == ActionKind::B && a.microbatch == mb);
        row.insert(at.unwrap(), Action::new(0, ActionKind::R, mb));
    }
    validate(&some).unwrap();
    let (partial, kept, got) = peaks(&some);
    assert_eq!(got, base, "same bits");
    assert_eq!(kept[0], whole[0], "microbatch 0 keeps its whole stash");
    assert_eq!(partial[0], every[0], "{partial:?} against {every:?}");
    assert!(partial[0] < none[0], "{partial:?} against {none:?}");
}
