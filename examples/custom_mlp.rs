//! Bring your own model: an MLP regression the runtime has never heard of (f32 features in,
//! one f32 out, mean squared error), written as a list of layers, cut into 4 stages by
//! parameter count and trained with interleaved 1F1B on 2 pipeline devices, then checked
//! against the same model trained on one device.
//!
//! `cargo run --release --example custom_mlp` prints both runs' losses and exits non-zero if
//! they differ by more than 1e-5 (relative). `cli/tests/it/custom_mlp.rs` reuses this model under
//! more meshes and schedules.
//!
//! `cargo run --release --example custom_mlp -- --profile FILE` instead profiles the model
//! (each layer's times, parameters and bytes on one microbatch) into FILE for
//! `pipewright plan --profile FILE --gpus N --global-batch SAMPLES`.

use pipewright::kernels::init::normal_tensor;
use pipewright::prelude::*;
use pipewright::runtime::split::layer_profile;
use pipewright::schedule::LayerProfile;

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

/// The first layer's input.
fn features(rows: &Rows) -> Result<Tensor, ModuleError> {
    Ok(rows.x.clone())
}

/// Mean squared error of the predictions and its gradient (the stage multiplies both by
/// the runtime's loss scale, `1 / (dp * m)`, and the runtime sums the global batch).
fn mse(pred: &Tensor, rows: &Rows) -> Result<(f32, Tensor), ModuleError> {
    let s = 1.0 / ROWS as f32;
    let err: Vec<f32> = pred
        .data()
        .iter()
        .zip(&rows.y)
        .map(|(p, t)| p - t)
        .collect();
    let grad = Tensor::new(&[ROWS, 1], err.iter().map(|e| 2.0 * s * e).collect())?;
    Ok((s * err.iter().map(|e| e * e).sum::<f32>(), grad))
}

/// A linear layer, then a ReLU unless it is the model's last.
#[derive(Parameters)]
#[parameters(lin)]
struct Dense {
    lin: Linear,
    relu: bool,
}

impl Layer for Dense {
    /// Input and output.
    type Stash = (Tensor, Tensor);
    /// Input and output gradient.
    type WeightStash = (Tensor, Tensor);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Self::Stash), ModuleError> {
        let mut y = self.lin.forward(x)?;
        if self.relu {
            y.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
        }
        Ok((y.clone(), (x.clone(), y)))
    }

    fn backward_input(
        &mut self,
        (x, y): Self::Stash,
        dy: &Tensor,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError> {
        let mut dy = dy.clone();
        if self.relu {
            dy.data_mut()
                .iter_mut()
                .zip(y.data())
                .for_each(|(d, &y)| *d *= f32::from(y > 0.0));
        }
        Ok((self.lin.backward_input(&dy)?, (x, dy)))
    }

    fn backward_weight(&mut self, (x, dy): Self::WeightStash) -> Result<(), ModuleError> {
        Ok(self.lin.backward_weight(&x, &dy)?)
    }
}

/// Layer `k` of `n`, seeded by its index (so the whole model and its stages hold the same
/// weights).
pub fn layer(k: usize, n: usize) -> Result<BoxedLayer, ModuleError> {
    let (i, o) = (
        if k == 0 { IN } else { WIDTH },
        if k + 1 == n { 1 } else { WIDTH },
    );
    let w = normal_tensor(&[i, o], (2.0 / i as f32).sqrt(), 7, &format!("w{k}"));
    let lin = Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o])))?;
    Ok(Box::new(Dense {
        lin,
        relu: k + 1 < n,
    }))
}

// ---- Training it: one `run` call, on any mesh; a mesh of one device is the reference. ----

/// The losses of `opts.steps` steps of the `n`-layer model on `mesh` under `tt`, cut into
/// the timetable's stages by parameter count.
pub fn train(
    mesh: Mesh,
    tt: &Checked,
    n: usize,
    opts: &RunOptions,
) -> Result<Vec<f32>, ModuleError> {
    let stages = tt.num_stages() as usize;
    let cuts = cut(n, stages, Balance::Parameters, None, |k| layer(k, n))?.stages;
    let make = |_, s| LayerStage::part(&cuts, s, |k| layer(k, n), features, mse);
    let mut losses = Vec::new();
    run(mesh, tt, make, rows, opts, |step| {
        losses.push(step.loss.unwrap_or(f32::NAN))
    })?;
    Ok(losses)
}

/// The one-device reference: the same global batch of `microbatches` microbatches per step
/// (`dp * m` of a run with `dp` replicas) on a mesh of one device.
pub fn one_device(n: usize, microbatches: u32, opts: &RunOptions) -> Result<Vec<f32>, ModuleError> {
    let tt = Checked::new(generate(&ScheduleSpec::new(
        ScheduleKind::GPipe,
        1,
        1,
        microbatches,
        None,
    )?))?;
    train(Mesh::new(1, 1, 1)?, &tt, n, opts)
}

/// Whether two losses agree within 1e-5, relative.
pub fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

// ---- Profiling it for `pipewright plan --profile`. ----

/// The `n`-layer model profiled on one microbatch of `ROWS` rows (5 passes, medians).
pub fn profile(n: usize) -> Result<LayerProfile, ModuleError> {
    let mut layers = (0..n).map(|k| layer(k, n)).collect::<Result<Vec<_>, _>>()?;
    let sample = normal_tensor(&[ROWS, IN], 1.0, 0, "sample");
    let device = format!("this CPU (example custom_mlp, {ROWS} rows of {IN} features)");
    Ok(layer_profile(
        &mut layers,
        &sample,
        ROWS as u64,
        5,
        &device,
    )?)
}

/// Write the profile to `path` (atomically: `LayerProfile::write`).
fn write_profile(n: usize, path: &std::path::Path) -> Result<(), ModuleError> {
    profile(n)?.write(path)?;
    println!(
        "wrote {}; plan it with: pipewright plan --profile {} --gpus 8 --global-batch 512",
        path.display(),
        path.display()
    );
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), ModuleError> {
    let (layers, steps) = (6, 30);
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--profile") {
        let path = args.get(i + 1).ok_or("--profile needs a FILE")?;
        return write_profile(layers, std::path::Path::new(path));
    }
    let tt = Checked::new(generate(&ScheduleSpec::new(
        ScheduleKind::Interleaved1F1B,
        2,
        2,
        4,
        None,
    )?))?;
    let opts = RunOptions {
        steps,
        adamw: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    };
    let piped = train(Mesh::new(2, 1, 1)?, &tt, layers, &opts)?;
    let single = one_device(layers, tt.microbatches, &opts)?;
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
