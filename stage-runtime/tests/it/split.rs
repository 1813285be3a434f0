//! The layer-list splitter: partitions are contiguous, cover every layer, and balance as well
//! as contiguous cuts can; a profile becomes a cost file the simulator reads; a layer-list
//! model cut into stages trains to the losses of one device.

use pipewright_schedule::Checked;
use std::ops::Range;

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::NoTp;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_runtime::split::{
    balanced, profile, split, stage_costs, uniform, Balance, SplitError,
};
use pipewright_runtime::{
    run, Mesh, MicrobatchData, MicrobatchId, Output, RunOptions, StageModule,
};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
use pipewright_sim::{CostModel, RawCostFile};

use crate::user_mlp;
use user_mlp::{model, rows, stage};

fn assert_partition(ranges: &[Range<usize>], n: usize, stages: usize) {
    assert_eq!(ranges.len(), stages);
    let mut next = 0;
    for r in ranges {
        assert_eq!(r.start, next, "contiguous: {ranges:?}");
        assert!(r.end > r.start, "non-empty: {ranges:?}");
        next = r.end;
    }
    assert_eq!(next, n, "covers every layer: {ranges:?}");
}

fn max_load(weights: &[f64], ranges: &[Range<usize>]) -> f64 {
    ranges
        .iter()
        .map(|r| weights[r.clone()].iter().sum::<f64>())
        .fold(0.0, f64::max)
}

/// The least largest load over every way of cutting `weights` into `stages` parts.
fn brute_force(weights: &[f64], stages: usize) -> f64 {
    fn go(w: &[f64], start: usize, left: usize) -> f64 {
        if left == 1 {
            return w[start..].iter().sum();
        }
        (start + 1..=w.len() - (left - 1))
            .map(|end| {
                let head: f64 = w[start..end].iter().sum();
                head.max(go(w, end, left - 1))
            })
            .fold(f64::INFINITY, f64::min)
    }
    go(weights, 0, stages)
}

#[test]
fn balanced_cuts_are_contiguous_complete_and_optimal() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 1000) as f64 / 10.0
    };
    for n in 1..=9 {
        let weights: Vec<f64> = (0..n).map(|_| next()).collect();
        for stages in 1..=n {
            let r = balanced(&weights, stages).unwrap();
            assert_partition(&r, n, stages);
            let (got, best) = (max_load(&weights, &r), brute_force(&weights, stages));
            assert!(
                (got - best).abs() < 1e-9,
                "{weights:?} / {stages}: {got} vs {best}"
            );
            let total: f64 = weights.iter().sum();
            let heaviest = weights.iter().cloned().fold(0.0, f64::max);
            assert!(got <= total / stages as f64 + heaviest + 1e-9);
        }
    }
}

#[test]
fn uniform_cuts_differ_by_at_most_one_layer_and_too_few_layers_are_refused() {
    for n in 1..20 {
        for stages in 1..=n {
            let r = uniform(n, stages).unwrap();
            assert_partition(&r, n, stages);
            let sizes: Vec<usize> = r.iter().map(|r| r.len()).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 1, "{n} / {stages}: {sizes:?}");
        }
    }
    let e = uniform(3, 4).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot cut 3 layers into 4 stages: every stage needs a layer"
    );
    assert!(matches!(
        split(&mut model(3), 4, Balance::Parameters, None),
        Err(SplitError::TooFewLayers { .. })
    ));
}

#[test]
fn splitting_by_parameters_balances_the_layers_parameter_counts() {
    let mut layers = model(10);
    let p = split(&mut layers, 4, Balance::Parameters, None).unwrap();
    assert_partition(&p.stages, 10, 4);
    let counts: Vec<f64> = layers.iter().map(|l| l.num_params() as f64).collect();
    assert_eq!(p.weights, counts);
    assert_eq!(max_load(&counts, &p.stages), brute_force(&counts, 4));
    let text = p.to_string();
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text.starts_with("stage 0: layers 0.."), "{text}");
}

#[test]
fn splitting_by_time_profiles_every_layer_and_leaves_no_gradient_behind() {
    let mut layers = model(8);
    let sample = normal_tensor(&[32, 4], 1.0, 1, "sample");
    assert!(matches!(
        split(&mut layers, 4, Balance::Time { repeats: 3 }, None),
        Err(SplitError::NoSample)
    ));
    let p = split(&mut layers, 4, Balance::Time { repeats: 3 }, Some(&sample)).unwrap();
    assert_partition(&p.stages, 8, 4);
    assert!(p.weights.iter().all(|&w| w > 0.0), "{:?}", p.weights);
    for l in &layers {
        assert!(l.flat_grads().iter().all(|&g| g == 0.0));
    }
    let costs = profile(&mut layers, &sample, 2).unwrap();
    let e = stage_costs(&costs, &[0..4, 4..9]).unwrap_err();
    let want = "stage 1's layers 4..9 are not within the profile's 8 layers";
    assert_eq!(e.to_string(), want);
    let stages = stage_costs(&costs, &p.stages).unwrap();
    let fiw = stages.iter().map(|c| [c.f, c.i, c.w]);
    let file = RawCostFile::from_stage_ms(fiw, "pipewright_stage::split::profile".into());
    let text = serde_json::to_string(&file).unwrap();
    let model = CostModel::from_json(&text, 4).unwrap();
    for (k, r) in p.stages.iter().enumerate() {
        let f: f64 = costs[r.clone()].iter().map(|c| c.f).sum();
        let w: f64 = costs[r.clone()].iter().map(|c| c.w).sum();
        assert!((model.stages[k].f - f).abs() < 1e-12);
        assert!((model.stages[k].w - w).abs() < 1e-12);
    }
}

#[test]
fn a_layer_list_cut_into_stages_trains_to_the_losses_of_one_device() {
    let (n, steps, m) = (10, 4, 4);
    let adamw = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let mut whole = stage(0..n, n);
    let mut want = Vec::new();
    for step in 0..steps {
        let mut total = 0.0;
        for j in 0..2 * m {
            let id = MicrobatchId {
                step,
                dp: 0,
                microbatch: j,
                microbatches: 2 * m,
            };
            let data = rows(id).unwrap();
            let mb = MicrobatchData {
                index: j,
                data: &data,
                loss_scale: 1.0 / (2 * m) as f32,
            };
            let (out, stash) = whole.forward(&mb, None, &mut NoTp).unwrap();
            let Output::Loss(l) = out else { panic!() };
            total += l;
            whole.backward(stash, None, &mut NoTp).unwrap();
        }
        whole.optimizer_step(&adamw).unwrap();
        want.push(total);
    }
    for (kind, v) in [
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Zbv, 2),
    ] {
        let tt = generate(&ScheduleSpec::new(kind, 2, v, m, None).unwrap());
        let stages = tt.num_stages() as usize;
        let p = split(&mut model(n), stages, Balance::Parameters, None).unwrap();
        let train = |recompute: &str| {
            let opts = RunOptions {
                steps,
                adamw,
                recompute: recompute.parse().unwrap(),
                ..RunOptions::default()
            };
            let mut got = Vec::new();
            let make = |_, s: u32| Ok(stage(p.stages[s as usize].clone(), n));
            let params = run(
                Mesh::new(2, 1, 2).unwrap(),
                &Checked::new(tt.clone()).unwrap(),
                make,
                rows,
                &opts,
                |s| got.push(s.loss.unwrap()),
            )
            .unwrap();
            (got, params)
        };
        let (got, params) = train("none");
        // Full recomputation reruns the layers' forwards: the same bits.
        let (again, params_again) = train("full");
        assert_eq!(again, got, "{} with full recomputation", tt.name);
        assert_eq!(params_again, params, "{} with full recomputation", tt.name);
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                "{}: {got:?} vs {want:?}",
                tt.name
            );
        }
        assert_eq!(got.len(), want.len());
    }
    assert!(want[steps as usize - 1] < want[0], "it trains: {want:?}");
}
