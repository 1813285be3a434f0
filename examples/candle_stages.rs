//! A candle model on pipeline stages: an MLP regression with residual blocks, written with
//! plain `candle_nn` (linear layers, `Sequential`, a `VarMap`), cut into 2 stages that the
//! runtime trains through the candle bridge (`runtime::candle::CandleStage`) with 1F1B on 2
//! devices, then checked against the same model trained by plain candle on one device (no
//! pipewright), both with candle's AdamW.
//!
//! `cargo run --release --features candle --example candle_stages` prints both runs' losses
//! and exits non-zero if they differ by more than 1e-5 (relative).
//! `stage-runtime/tests/candle.rs` reuses this model under more meshes and schedules.

use std::ops::Range;

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_runtime::candle::candle_core::backprop::GradStore;
use pipewright_runtime::candle::candle_core::{DType, Device, Error, Module, Result, Tensor};
use pipewright_runtime::candle::candle_nn::{self, linear, AdamW, Optimizer, VarBuilder, VarMap};
use pipewright_runtime::candle::{adamw_params, to_candle, CandleStage};
use pipewright_runtime::{MicrobatchId, ModuleError};

// ---- The user's candle model. ----

const IN: usize = 8; // features per row
const WIDTH: usize = 32; // hidden width
const ROWS: usize = 16; // rows per microbatch
/// The layers: an input projection, residual blocks, a head.
pub const LAYERS: usize = 6;

/// One microbatch: features `[ROWS, IN]` and targets `[ROWS, 1]`.
pub struct Rows {
    x: Tensor,
    y: Tensor,
}

/// Microbatch `id`: random features, target `sum(sin(x))`; a pure function of the step and
/// the microbatch's place in the global batch, so every rank builds the same one.
pub fn rows(id: MicrobatchId) -> std::result::Result<Rows, ModuleError> {
    let x = normal_tensor(&[ROWS, IN], 1.0, id.step, &format!("x{}", id.global()));
    let x = to_candle(&x)?;
    let y = x.sin()?.sum_keepdim(1)?;
    Ok(Rows { x, y })
}

/// `x + fc2(tanh(fc1(x)))`.
struct Block {
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x + self.fc2.forward(&self.fc1.forward(x)?.tanh()?)?
    }
}

/// Layers `range` of the model, their variables in `vars`, with weights fixed by each
/// variable's name (so the whole model and its stages start equal).
pub fn chunk(range: Range<usize>, vars: &VarMap) -> Result<candle_nn::Sequential> {
    let vb = VarBuilder::from_varmap(vars, DType::F32, &Device::Cpu);
    let mut seq = candle_nn::seq();
    for k in range {
        seq = match k {
            0 => seq.add(linear(IN, WIDTH, vb.pp("embed"))?),
            k if k + 1 == LAYERS => seq.add(linear(WIDTH, 1, vb.pp("head"))?),
            k => seq.add(Block {
                fc1: linear(WIDTH, WIDTH, vb.pp(format!("block{k}.fc1")))?,
                fc2: linear(WIDTH, WIDTH, vb.pp(format!("block{k}.fc2")))?,
            }),
        };
    }
    let vars = vars
        .data()
        .lock()
        .map_err(|_| Error::Msg("poisoned".into()))?;
    for (name, var) in vars.iter() {
        let dims = var.dims();
        let std = if name.ends_with("bias") {
            0.0
        } else {
            (dims[1] as f32).sqrt().recip()
        };
        var.set(&to_candle(&normal_tensor(dims, std, 7, name))?)?;
    }
    Ok(seq)
}

/// Mean squared error times the runtime's loss scale.
fn mse(pred: &Tensor, rows: &Rows, scale: f32) -> Result<Tensor> {
    candle_nn::loss::mse(pred, &rows.y)? * f64::from(scale)
}

/// Pipeline stage `s` of `cuts`: its layers through the candle bridge.
pub fn stage(
    cuts: &[Range<usize>],
    s: usize,
) -> std::result::Result<CandleStage<Rows>, ModuleError> {
    let vars = VarMap::new();
    let mut stage = CandleStage::new(chunk(cuts[s].clone(), &vars)?, &vars);
    if s == 0 {
        stage = stage.with_input(|r: &Rows| Ok(r.x.clone()));
    }
    if s + 1 == cuts.len() {
        stage = stage.with_loss(mse);
    }
    Ok(stage)
}

/// The losses of `steps` steps of the whole model trained by plain candle on one device:
/// each step accumulates the gradients of `microbatches` microbatches, then AdamW.
pub fn one_device(
    microbatches: u32,
    steps: u64,
    cfg: &AdamWConfig,
) -> std::result::Result<Vec<f32>, ModuleError> {
    let vars = VarMap::new();
    let model = chunk(0..LAYERS, &vars)?;
    let params = vars.all_vars();
    let mut opt = AdamW::new(params.clone(), adamw_params(cfg))?;
    let mut losses = Vec::new();
    for step in 0..steps {
        let (mut total, mut acc) = (0.0, vec![None::<Tensor>; params.len()]);
        for microbatch in 0..microbatches {
            let r = rows(MicrobatchId {
                step,
                dp: 0,
                microbatch,
                microbatches,
            })?;
            let loss = mse(&model.forward(&r.x)?, &r, 1.0 / microbatches as f32)?;
            total += loss.to_scalar::<f32>()?;
            let grads = loss.backward()?;
            for (p, a) in params.iter().zip(&mut acc) {
                let g = grads.get(p).ok_or("a variable without a gradient")?;
                *a = Some(match a.take() {
                    Some(a) => (a + g)?,
                    None => g.clone(),
                });
            }
        }
        let mut store = GradStore::default();
        for (p, a) in params.iter().zip(acc) {
            store.insert(p, a.ok_or("no microbatches")?);
        }
        opt.step(&store)?;
        losses.push(total);
    }
    Ok(losses)
}

/// Whether two losses agree within 1e-5, relative.
pub fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

#[allow(dead_code)]
fn main() -> std::result::Result<(), ModuleError> {
    use pipewright_runtime::{run, Mesh, RunOptions};
    use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

    let steps = 30;
    let tt = Checked::new(generate(&ScheduleSpec::new(
        ScheduleKind::OneFOneB,
        2,
        1,
        4,
        None,
    )?))?;
    let cuts = [0..3, 3..LAYERS];
    let opts = RunOptions {
        steps,
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    };
    let mut piped = Vec::new();
    run(
        Mesh::new(2, 1, 1)?,
        &tt,
        |_, s| stage(&cuts, s as usize),
        rows,
        &opts,
        |s| piped.push(s.loss.unwrap_or(f32::NAN)),
    )?;
    let single = one_device(tt.microbatches, steps, &opts.adamw)?;
    for (step, (a, b)) in piped.iter().zip(&single).enumerate().step_by(5) {
        println!("step {step:2}: 2 devices {a:.6}  one device (plain candle) {b:.6}");
    }
    let equal =
        piped.len() == single.len() && piped.iter().zip(&single).all(|(a, b)| close(*a, *b));
    if !equal || single[single.len() - 1] >= single[0] {
        eprintln!(
            "error: candle {} on 2 devices does not match one device (or does not train)",
            tt.name
        );
        std::process::exit(1);
    }
    println!(
        "ok: candle {} on 2 devices equals plain candle on one device for {steps} steps",
        tt.name
    );
    Ok(())
}
