//! Bring your own model: an MLP regression the runtime has never heard of (f32 features in,
//! one f32 out, mean squared error), cut into 4 stages and trained with interleaved 1F1B on
//! 2 pipeline devices, then checked against the same model trained on one device.
//!
//! `cargo run --release --example custom_mlp` prints both runs' losses and exits non-zero if
//! they differ by more than 1e-5 (relative). `tests/custom_mlp.rs` reuses this model under
//! more meshes and schedules.

use pipewright::kernels::init::normal_tensor;
use pipewright::kernels::layers::{Linear, NoTp, TpReduce};
use pipewright::kernels::optim::AdamWConfig;
use pipewright::kernels::Tensor;
use pipewright::runtime::host::{self, HostAdamW};
use pipewright::runtime::{run, MicrobatchData, MicrobatchId, ModuleError, Output, StageModule};

// ---- The user's model: everything up to "Training it" is what a user writes. ----

const IN: usize = 8; // features per row
const WIDTH: usize = 32; // hidden width
const ROWS: usize = 16; // rows per microbatch

/// One microbatch: features and targets, built on every rank that needs them.
pub struct Rows {
    x: Tensor,
    y: Vec<f32>,
}

/// Microbatch `id`: random features, target `sum(sin(x))`; a pure function of the step and
/// the microbatch's place in the global batch.
pub fn rows(id: MicrobatchId) -> Result<Rows, ModuleError> {
    let x = normal_tensor(&[ROWS, IN], 1.0, id.step, &format!("x{}", id.global()));
    let y = x
        .data()
        .chunks(IN)
        .map(|r| r.iter().map(|v| v.sin()).sum())
        .collect();
    Ok(Rows { x, y })
}

/// A contiguous share of an MLP's linear layers, ReLU after all but the model's last.
pub struct Mlp {
    layers: Vec<Linear>,
    last: bool,
    opt: HostAdamW,
}

impl Mlp {
    /// Stage `stage` of `stages` of a model of `n` layers, weights seeded per layer (so the
    /// whole model and its stages hold the same numbers).
    pub fn stage(stage: usize, stages: usize, n: usize) -> Result<Self, ModuleError> {
        let range = stage * n / stages..(stage + 1) * n / stages;
        let last = range.end == n;
        let dims = |k: usize| {
            (
                if k == 0 { IN } else { WIDTH },
                if k + 1 == n { 1 } else { WIDTH },
            )
        };
        let layer = |k: usize| {
            let (i, o) = dims(k);
            let w = normal_tensor(&[i, o], (2.0 / i as f32).sqrt(), 7, &format!("w{k}"));
            Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o])))
        };
        let layers = range.map(layer).collect::<Result<_, _>>()?;
        Ok(Mlp {
            layers,
            last,
            opt: HostAdamW::default(),
        })
    }

    fn relu(&self, k: usize) -> bool {
        !(self.last && k + 1 == self.layers.len())
    }
}

impl StageModule for Mlp {
    type Tensor = Tensor;
    type Data = Rows;
    /// Each layer's input and output; on the last stage, the loss gradient.
    type Stash = (Vec<(Tensor, Tensor)>, Option<Tensor>);
    /// Each layer's input and output gradient, last layer first.
    type WeightStash = Vec<(Tensor, Tensor)>;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, Rows>,
        input: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, Self::Stash), ModuleError> {
        let mut x = input.unwrap_or_else(|| mb.data.x.clone());
        let mut saved = Vec::new();
        for k in 0..self.layers.len() {
            let mut y = self.layers[k].forward(&x)?;
            if self.relu(k) {
                y.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
            }
            saved.push((std::mem::replace(&mut x, y.clone()), y));
        }
        if !self.last {
            return Ok((Output::Hidden(x), (saved, None)));
        }
        // Mean squared error, times the runtime's loss scale.
        let s = mb.loss_scale / ROWS as f32;
        let err: Vec<f32> = x
            .data()
            .iter()
            .zip(&mb.data.y)
            .map(|(p, t)| p - t)
            .collect();
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        let grad = Tensor::new(&[ROWS, 1], err.iter().map(|e| 2.0 * s * e).collect())?;
        Ok((Output::Loss(loss), (saved, Some(grad))))
    }

    fn backward_input(
        &mut self,
        (saved, loss_grad): Self::Stash,
        grad_out: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, Self::WeightStash), ModuleError> {
        let mut dy = grad_out.or(loss_grad).ok_or("no output gradient")?;
        let mut ws = Vec::new();
        for (k, (x, y)) in saved.into_iter().enumerate().rev() {
            if self.relu(k) {
                dy.data_mut()
                    .iter_mut()
                    .zip(y.data())
                    .for_each(|(d, &y)| *d *= f32::from(y > 0.0));
            }
            let dx = self.layers[k].backward_input(&dy)?;
            ws.push((x, std::mem::replace(&mut dy, dx)));
        }
        Ok((Some(dy), ws))
    }

    fn backward_weight(&mut self, ws: Self::WeightStash) -> Result<(), ModuleError> {
        let layers = self.layers.iter_mut().rev();
        layers
            .zip(&ws)
            .try_for_each(|(l, (x, dy))| l.backward_weight(x, dy))?;
        Ok(())
    }

    // Gradients, optimizer and parameters: the library's host helpers over the layers.
    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        host::flat_grads(&self.layers)
    }
    fn set_flat_grads(&mut self, grads: Tensor) -> Result<(), ModuleError> {
        host::set_flat_grads(&mut self.layers, grads)
    }
    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.opt.step(&mut self.layers, cfg)
    }
    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        host::flat_params(&self.layers)
    }
}

// ---- Training it, on 2 pipeline devices and on one. ----

/// The losses of `steps` steps of the whole model on one device, over the same global batch
/// of `microbatches` microbatches per step.
pub fn one_device(
    layers: usize,
    microbatches: u32,
    steps: u64,
    cfg: &AdamWConfig,
) -> Result<Vec<f32>, ModuleError> {
    let mut whole = Mlp::stage(0, 1, layers)?;
    let mut losses = Vec::new();
    for step in 0..steps {
        let mut total = 0.0;
        for microbatch in 0..microbatches {
            let id = MicrobatchId {
                step,
                dp: 0,
                microbatch,
                microbatches,
            };
            let data = rows(id)?;
            let mb = MicrobatchData {
                index: microbatch,
                data: &data,
                loss_scale: 1.0 / microbatches as f32,
            };
            let (out, stash) = whole.forward(&mb, None, &mut NoTp)?;
            if let Output::Loss(l) = out {
                total += l;
            }
            whole.backward(stash, None, &mut NoTp)?;
        }
        whole.optimizer_step(cfg)?;
        losses.push(total);
    }
    Ok(losses)
}

/// Whether two losses agree within 1e-5, relative.
pub fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

#[allow(dead_code)]
fn main() -> Result<(), ModuleError> {
    use pipewright::runtime::{Mesh, RunOptions};
    use pipewright::schedule::{generate, ScheduleKind, ScheduleSpec};

    let (layers, steps) = (4, 30);
    let tt = generate(&ScheduleSpec::new(
        ScheduleKind::Interleaved1F1B,
        2,
        2,
        4,
        None,
    )?);
    let stages = tt.num_stages() as usize;
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
        |_, stage| Mlp::stage(stage as usize, stages, layers),
        rows,
        &opts,
        |s| piped.push(s.loss.unwrap_or(f32::NAN)),
    )?;
    let single = one_device(layers, tt.microbatches, steps, &opts.adamw)?;
    for (step, (a, b)) in piped.iter().zip(&single).enumerate().step_by(5) {
        println!("step {step:2}: 2 devices {a:.6}  one device {b:.6}");
    }
    let equal =
        piped.len() == single.len() && piped.iter().zip(&single).all(|(a, b)| close(*a, *b));
    if !equal || single[single.len() - 1] >= single[0] {
        eprintln!(
            "error: {} on 2 devices does not match one device (or does not train)",
            tt.name
        );
        std::process::exit(1);
    }
    println!(
        "ok: {} on 2 devices equals one device for {steps} steps",
        tt.name
    );
    Ok(())
}
