//! The reference GPT on any backend against the host path.
//!
//! `on_cpu_*`: the backend-generic path on `Cpu` (flat gradients through
//! backend tensors, `DeviceAdamW`, device-side zeroing) gives bit-identical
//! losses and parameters to the host path the runtime uses today
//! (`flat_grads`/`set_flat_grads`, `AdamW`, `zero_grad`).
//! `cuda_*` (feature `cuda`): a stage on GPU 0 against the CPU, same seed:
//! loss, input gradient, weight gradients and parameters after 3 AdamW
//! steps within 1e-4 relative, whole and split in two, in GPT-2's shape and
//! in Llama's (grouped-query attention, SwiGLU, RMSNorm). Without a usable
//! GPU it prints `skipped: <why>` and passes.

use pipewright_kernels::gpt::{
    GptConfig, GptStage, Microbatch, MlpKind, NormKind, Positions, StageOutput,
};
use pipewright_kernels::layers::{NoTp, Parameters, TpShard};
use pipewright_kernels::optim::{AdamW, AdamWConfig, DeviceAdamW};
use pipewright_kernels::{params, Backend, Cpu, Tensor};
use std::sync::Arc;

const SEED: u64 = 11;
const STEPS: usize = 3;

fn cfg() -> GptConfig {
    GptConfig::new(16, 8, 32, 4, 2)
}

/// Llama's shape: 4 query heads reading 2 key/value heads, SwiGLU, RMSNorm, rotary
/// positions (Llama 3's base).
fn llama() -> GptConfig {
    GptConfig {
        kv_heads: 2,
        d_ff: 88,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: Positions::Rotary { theta: 500_000.0 },
        ..cfg()
    }
}

/// eps = 1e-3 keeps the comparison well-conditioned: with a tiny eps a
/// gradient near zero moves its weight by about `lr * sign(g)`, so rounding
/// noise in `g` could flip a whole step; here updates are smooth in `g`.
fn adamw_cfg() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-2,
        eps: 1e-3,
        ..Default::default()
    }
}

fn data(step: usize) -> (Vec<u32>, Vec<u32>) {
    let tokens: Vec<u32> = (0..16).map(|i| ((i * 7 + 3 * step) % 16) as u32).collect();
    let targets = tokens.iter().map(|t| (t * 5 + 1) % 16).collect();
    (tokens, targets)
}

/// One pipeline of stages on one backend, with an optimizer per stage.
struct Pipeline<B: Backend> {
    be: Arc<B>,
    stages: Vec<GptStage<B>>,
    opts: Vec<DeviceAdamW<B>>,
}

/// What one step produced, on the host: the loss, the gradient each stage
/// but the first sent back, and every stage's weight gradients per parameter.
struct StepOut {
    loss: f32,
    input_grads: Vec<Tensor>,
    grads: Vec<(String, Tensor)>,
}

impl<B: Backend> Pipeline<B> {
    fn new(be: Arc<B>, n: usize) -> Self {
        Self::of(be, n, &cfg())
    }

    fn of(be: Arc<B>, n: usize, cfg: &GptConfig) -> Self {
        let stages: Vec<_> = (0..n)
            .map(|s| GptStage::on(&be, cfg, SEED, s, n, TpShard::SINGLE).unwrap())
            .collect();
        let opts = stages
            .iter()
            .map(|s| DeviceAdamW::new(&*be, s, adamw_cfg()).unwrap())
            .collect();
        Self { be, stages, opts }
    }

    /// Forward and backward of one microbatch (gradients accumulate).
    fn run(&mut self, step: usize) -> StepOut {
        let (tokens, targets) = data(step);
        let mb = Microbatch {
            tokens: &tokens,
            targets: &targets,
            seq: 8,
            loss_scale: 1.0,
        };
        let (mut x, mut stashes, mut loss) = (None, Vec::new(), f32::NAN);
        for st in &self.stages {
            let (out, stash) = st.forward(&mb, x.take(), &mut NoTp).unwrap();
            stashes.push(stash);
            match out {
                StageOutput::Hidden(h) => x = Some(h),
                StageOutput::Loss(l) => loss = l,
            }
        }
        let (mut g, mut input_grads) = (None, Vec::new());
        for (st, stash) in self.stages.iter_mut().zip(stashes).rev() {
            let (dx, ws) = st.backward_input(stash, g.take(), &mut NoTp).unwrap();
            st.backward_weight(ws).unwrap();
            if let Some(dx) = &dx {
                input_grads.push(self.be.download(dx).unwrap());
            }
            g = dx;
        }
        let mut grads = Vec::new();
        for st in &self.stages {
            st.visit(&mut |p| grads.push((p.name.clone(), self.be.download(&p.grad).unwrap())));
        }
        StepOut {
            loss,
            input_grads,
            grads,
        }
    }

    /// The runtime's step through backend tensors: flatten the gradients
    /// (as for a DP all-reduce), set them back, AdamW, zero.
    fn step(&mut self) {
        for (st, opt) in self.stages.iter_mut().zip(&mut self.opts) {
            let flat = params::flat_grads(&*self.be, st).unwrap();
            params::zero_grads(&*self.be, st).unwrap();
            params::set_flat_grads(&*self.be, st, &flat).unwrap();
            opt.step(&*self.be, st).unwrap();
            params::zero_grads(&*self.be, st).unwrap();
        }
    }

    fn params(&self) -> Vec<f32> {
        let be = &*self.be;
        (self.stages.iter())
            .flat_map(|s| params::flat_params_host(be, s).unwrap())
            .collect()
    }
}

/// The host path, as the runtime drives `GptStage` today.
fn host_step(stages: &mut [GptStage], opts: &mut [AdamW]) {
    for (st, opt) in stages.iter_mut().zip(opts) {
        let flat = st.flat_grads();
        st.zero_grad();
        st.set_flat_grads(&flat).unwrap();
        opt.step(st).unwrap();
        st.zero_grad();
    }
}

fn host_pipeline(n: usize) -> (Pipeline<Cpu>, Vec<AdamW>) {
    let p = Pipeline::new(Arc::new(Cpu), n);
    let opts = (p.stages.iter())
        .map(|s| AdamW::new(s.num_params(), adamw_cfg()))
        .collect();
    (p, opts)
}

fn bit_identical_on_cpu(n: usize) {
    let (mut host, mut host_opts) = host_pipeline(n);
    let mut generic = Pipeline::new(Arc::new(Cpu), n);
    for step in 0..STEPS {
        let (a, b) = (host.run(step), generic.run(step));
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {step} loss");
        host_step(&mut host.stages, &mut host_opts);
        generic.step();
        let (pa, pb) = (host.params(), generic.params());
        assert!(pa.iter().zip(&pb).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    // And the plain constructor builds the very same stage as `on`.
    let plain = GptStage::new(&cfg(), SEED, 0, n, TpShard::SINGLE).unwrap();
    let on = GptStage::on(&Arc::new(Cpu), &cfg(), SEED, 0, n, TpShard::SINGLE).unwrap();
    assert_eq!(plain.flat_params(), on.flat_params());
}

#[test]
fn on_cpu_generic_path_is_bit_identical_whole() {
    bit_identical_on_cpu(1);
}

#[test]
fn on_cpu_generic_path_is_bit_identical_split() {
    bit_identical_on_cpu(2);
}

#[test]
fn device_adamw_rejects_another_model() {
    let be = Cpu;
    let a = GptStage::new(&cfg(), SEED, 0, 2, TpShard::SINGLE).unwrap();
    let mut b = GptStage::new(&cfg(), SEED, 1, 2, TpShard::SINGLE).unwrap();
    let mut opt = DeviceAdamW::new(&be, &a, adamw_cfg()).unwrap();
    assert!(opt.step(&be, &mut b).is_err());
    let wrong = be.zeros(&[3]).unwrap();
    assert!(params::set_flat_grads(&be, &mut b, &wrong).is_err());
}

/// `|a - b| <= tol * max|want|` elementwise (relative to the tensor's scale).
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: {g} vs {w} (scale {scale})"
        );
    }
}

/// A pipeline of `n` stages of `cfg` on `be` against the CPU, step by step.
fn agrees_with_cpu<B: Backend>(be: Arc<B>, n: usize, cfg: &GptConfig) {
    const TOL: f32 = 1e-4;
    let (mut cpu, mut dev) = (
        Pipeline::of(Arc::new(Cpu), n, cfg),
        Pipeline::of(be, n, cfg),
    );
    for step in 0..STEPS {
        let (a, b) = (cpu.run(step), dev.run(step));
        let what = |x: &str| format!("{n} stages, step {step}: {x}");
        assert_close(&what("loss"), &[b.loss], &[a.loss], TOL);
        assert_eq!(a.input_grads.len(), n - 1);
        for (i, (ga, gb)) in a.input_grads.iter().zip(&b.input_grads).enumerate() {
            assert_close(&what(&format!("input grad {i}")), gb.data(), ga.data(), TOL);
        }
        for ((name, ga), (_, gb)) in a.grads.iter().zip(&b.grads) {
            assert_close(&what(name), gb.data(), ga.data(), TOL);
        }
        cpu.step();
        dev.step();
        assert_close(&what("params"), &dev.params(), &cpu.params(), TOL);
    }
}

#[test]
fn harness_agrees_cpu_with_itself() {
    agrees_with_cpu(Arc::new(Cpu), 2, &cfg());
    agrees_with_cpu(Arc::new(Cpu), 2, &llama());
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_stage_agrees_with_cpu() {
    if let Some(gpu) = pipewright_kernels::cuda::gpu_for_tests(0) {
        let gpu = Arc::new(gpu);
        for cfg in [cfg(), llama()] {
            agrees_with_cpu(gpu.clone(), 1, &cfg);
            agrees_with_cpu(gpu.clone(), 2, &cfg);
        }
    }
}
