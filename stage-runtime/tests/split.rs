//! The layer-list splitter: partitions are contiguous, cover every layer, and balance as well
//! as contiguous cuts can; a profile becomes a cost file the simulator reads; a layer-list
//! model cut into stages trains to the losses of one device.

use std::ops::Range;

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{Linear, NoTp, Param, Parameters};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Tensor;
use pipewright_runtime::split::{
    balanced, cost_file, profile, split, uniform, Balance, Layer, LayerStage, LayerStash, LossFn,
    SplitError,
};
use pipewright_runtime::{
    run, Mesh, MicrobatchData, MicrobatchId, ModuleError, Output, RunOptions, StageModule,
};
use pipewright_schedule::{generate, CostModel, ScheduleKind, ScheduleSpec};

/// A dense layer with an optional ReLU, as a user would write it.
struct Dense {
    lin: Linear,
    relu: bool,
}

fn dense(k: usize, i: usize, o: usize, relu: bool) -> Box<dyn Layer> {
    let w = normal_tensor(&[i, o], (1.0 / i as f32).sqrt(), 5, &format!("w{k}"));
    let lin = Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o]))).unwrap();
    Box::new(Dense { lin, relu })
}

impl Parameters for Dense {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.lin.visit(f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.lin.visit_mut(f)
    }
}

impl Layer for Dense {
    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, LayerStash), ModuleError> {
        let mut y = self.lin.forward(x)?;
        if self.relu {
            y.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
        }
        Ok((y.clone(), Box::new((x.clone(), y))))
    }

    fn backward_input(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
    ) -> Result<(Tensor, LayerStash), ModuleError> {
        let (x, y) = *stash.downcast::<(Tensor, Tensor)>().map_err(|_| "stash")?;
        let mut dy = dy.clone();
        if self.relu {
            let mask = y.data().iter().map(|&v| f32::from(v > 0.0));
            dy.data_mut()
                .iter_mut()
                .zip(mask)
                .for_each(|(d, m)| *d *= m);
        }
        Ok((self.lin.backward_input(&dy)?, Box::new((x, dy))))
    }

    fn backward_weight(&mut self, stash: LayerStash) -> Result<(), ModuleError> {
        let (x, dy) = *stash.downcast::<(Tensor, Tensor)>().map_err(|_| "stash")?;
        Ok(self.lin.backward_weight(&x, &dy)?)
    }
}

/// Layer `k` of `n`: widths vary so parameters and times differ between layers.
fn layer(k: usize, n: usize) -> Box<dyn Layer> {
    let width = |k: usize| if k == 0 { 4 } else { 8 + 8 * (k % 3) };
    let out = if k + 1 == n { 1 } else { width(k + 1) };
    dense(k, width(k), out, k + 1 < n)
}

fn model(n: usize) -> Vec<Box<dyn Layer>> {
    (0..n).map(|k| layer(k, n)).collect()
}

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
    let file = cost_file(&costs, &p.stages);
    let text = serde_json::to_string(&file).unwrap();
    let model = CostModel::from_json(&text, 4).unwrap();
    for (k, r) in p.stages.iter().enumerate() {
        let f: f64 = costs[r.clone()].iter().map(|c| c.f).sum();
        let w: f64 = costs[r.clone()].iter().map(|c| c.w).sum();
        assert!((model.stages[k].f - f).abs() < 1e-12);
        assert!((model.stages[k].w - w).abs() < 1e-12);
    }
}

/// Features and targets of one microbatch.
struct Rows(Tensor, Vec<f32>);

fn rows(id: MicrobatchId) -> Result<Rows, ModuleError> {
    let x = normal_tensor(&[8, 4], 1.0, id.step, &format!("x{}", id.global()));
    let y = x.data().chunks(4).map(|r| r[0] * r[1] - r[2]).collect();
    Ok(Rows(x, y))
}

fn mse() -> Box<LossFn<Rows>> {
    Box::new(|out: &Tensor, rows: &Rows, scale: f32| {
        let s = scale / rows.1.len() as f32;
        let err: Vec<f32> = out.data().iter().zip(&rows.1).map(|(p, t)| p - t).collect();
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        let grad = Tensor::new(out.shape(), err.iter().map(|e| 2.0 * s * e).collect())?;
        Ok((loss, grad))
    })
}

fn stage(range: Range<usize>, n: usize) -> LayerStage<Rows> {
    let first = range.start == 0;
    let last = range.end == n;
    let input = first.then(|| Box::new(|r: &Rows| r.0.clone()) as Box<_>);
    let layers = range.map(|k| layer(k, n)).collect();
    LayerStage::new(layers, input, last.then(mse))
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
        let opts = RunOptions {
            steps,
            adamw,
            ..RunOptions::default()
        };
        let mut got = Vec::new();
        let make = |_, s: u32| Ok(stage(p.stages[s as usize].clone(), n));
        run(Mesh::new(2, 1, 2).unwrap(), &tt, make, rows, &opts, |s| {
            got.push(s.loss.unwrap())
        })
        .unwrap();
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
