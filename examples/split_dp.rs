//! A hand-written `StageModule` with a split backward and data parallelism: a residual
//! classifier (LayerNorm and ReLU MLP blocks with skip connections, softmax cross-entropy)
//! whose stages implement the forward, the input backward (I) and the weight backward (W)
//! apart, and `flat_grads`/`set_flat_grads`, through which the runtime sums each stage's
//! gradients over the data-parallel replicas (a run with dp > 1 refuses a stage without
//! them). Trained with ZB-H1 on 2 pipeline devices and 2 replicas, and checked against the
//! same model on one device (`run` on a mesh of one, over the same global batch).
//!
//! `cargo run --release --example split_dp` prints both runs' losses and exits non-zero if
//! they differ by more than 1e-5 (relative). `tests/split_dp.rs` reuses this model under
//! more schedules.

use pipewright::kernels::cpu::{cross_entropy, cross_entropy_backward};
use pipewright::kernels::init::normal_tensor;
use pipewright::kernels::kept::HostNormStash;
use pipewright::prelude::*;

const FEATURES: usize = 12;
const WIDTH: usize = 32;
const CLASSES: usize = 5;
const ROWS: usize = 16;
/// Residual blocks, cut evenly into the stages.
pub const BLOCKS: usize = 4;

// ---- The data: rows of features, labelled by the direction they point to most. ----

/// One microbatch: features and class labels.
pub struct Batch {
    x: Tensor,
    labels: Vec<u32>,
}

/// Microbatch `id` of the step's global batch (the same batch every step, so the loss falls).
pub fn batch(id: MicrobatchId) -> Result<Batch, ModuleError> {
    let x = normal_tensor(&[ROWS, FEATURES], 1.0, 0, &format!("x{}", id.global()));
    let dirs = normal_tensor(&[FEATURES, CLASSES], 1.0, 1, "directions");
    let score = |row: &[f32], c: usize| -> f32 {
        let col = dirs.data().iter().skip(c).step_by(CLASSES);
        row.iter().zip(col).map(|(a, b)| a * b).sum()
    };
    let labels = x
        .data()
        .chunks(FEATURES)
        .map(|row| (0..CLASSES).max_by(|&a, &b| score(row, a).total_cmp(&score(row, b))))
        .map(|c| c.unwrap_or(0) as u32)
        .collect();
    Ok(Batch { x, labels })
}

// ---- The model's math: a residual block, the input projection and the head. ----

/// `x + fc2(relu(fc1(norm(x))))`.
#[derive(Parameters)]
#[parameters(norm, fc1, fc2)]
struct Block {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// What a block's forward keeps for its input backward.
#[derive(Footprint)]
struct BlockStash {
    norm: HostNormStash,
    n: Tensor,
    a: Tensor,
}

/// What a block's input backward keeps for its weight backward.
#[derive(Footprint)]
struct BlockWeightStash {
    norm: HostNormStash,
    n: Tensor,
    a: Tensor,
    dy: Tensor,
    dh: Tensor,
    dn: Tensor,
}

fn linear(name: &str, i: usize, o: usize) -> Result<Linear, ModuleError> {
    let w = normal_tensor(&[i, o], (1.0 / i as f32).sqrt(), 11, name);
    Ok(Linear::new(name, w, Some(Tensor::zeros(&[o])))?)
}

impl Block {
    /// Block `k` of the model, the same numbers wherever it is built.
    fn new(k: usize) -> Result<Self, ModuleError> {
        Ok(Block {
            norm: LayerNorm::new(&format!("b{k}.norm"), WIDTH),
            fc1: linear(&format!("b{k}.fc1"), WIDTH, WIDTH)?,
            fc2: linear(&format!("b{k}.fc2"), WIDTH, WIDTH)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, BlockStash), ModuleError> {
        let (n, norm) = self.norm.forward(x)?;
        let mut a = self.fc1.forward(&n)?;
        a.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
        let mut y = self.fc2.forward(&a)?;
        y.data_mut()
            .iter_mut()
            .zip(x.data())
            .for_each(|(y, x)| *y += x);
        Ok((y, BlockStash { norm, n, a }))
    }

    fn backward_input(
        &self,
        BlockStash { norm, n, a }: BlockStash,
        dy: Tensor,
    ) -> Result<(Tensor, BlockWeightStash), ModuleError> {
        let mut dh = self.fc2.backward_input(&dy)?;
        dh.data_mut()
            .iter_mut()
            .zip(a.data())
            .for_each(|(d, &a)| *d *= f32::from(a > 0.0));
        let dn = self.fc1.backward_input(&dh)?;
        let mut dx = self.norm.backward_input(&dn, &norm)?;
        dx.data_mut()
            .iter_mut()
            .zip(dy.data())
            .for_each(|(d, g)| *d += g);
        let ws = BlockWeightStash {
            norm,
            n,
            a,
            dy,
            dh,
            dn,
        };
        Ok((dx, ws))
    }

    fn backward_weight(&mut self, ws: BlockWeightStash) -> Result<(), ModuleError> {
        self.fc2.backward_weight(&ws.a, &ws.dy)?;
        self.fc1.backward_weight(&ws.n, &ws.dh)?;
        Ok(self.norm.backward_weight(&ws.dn, &ws.norm)?)
    }
}

/// A stage's layers: the input projection on the first stage, its blocks, the head on the last.
#[derive(Parameters)]
#[parameters(embed, blocks, head)]
struct Layers {
    embed: Option<Linear>,
    blocks: Vec<Block>,
    head: Option<Linear>,
}

// ---- The stage: a `StageModule` with a split backward and data-parallel gradients. ----

/// Stage `stage` of `stages`: blocks cut evenly, AdamW over its parameters.
pub struct Stage {
    layers: Layers,
    opt: HostAdamW,
}

/// What a stage's forward keeps: the features (first stage), the blocks' stashes, and the
/// head's input and the loss gradient (last stage).
#[derive(Footprint)]
pub struct Stash {
    features: Option<Tensor>,
    blocks: Vec<BlockStash>,
    head: Option<(Tensor, Tensor)>,
}

/// What a stage's input backward keeps for its weight backward.
#[derive(Footprint)]
pub struct WeightStash {
    embed: Option<(Tensor, Tensor)>,
    blocks: Vec<BlockWeightStash>,
    head: Option<(Tensor, Tensor)>,
}

impl Stage {
    /// Stage `stage` of `stages` (one stage holds the whole model).
    pub fn new(stage: usize, stages: usize) -> Result<Self, ModuleError> {
        let blocks = (stage * BLOCKS / stages..(stage + 1) * BLOCKS / stages)
            .map(Block::new)
            .collect::<Result<_, _>>()?;
        let last = stage + 1 == stages;
        let layers = Layers {
            embed: (stage == 0)
                .then(|| linear("embed", FEATURES, WIDTH))
                .transpose()?,
            blocks,
            head: last.then(|| linear("head", WIDTH, CLASSES)).transpose()?,
        };
        Ok(Stage {
            layers,
            opt: HostAdamW::default(),
        })
    }
}

impl StageModule for Stage {
    type Tensor = Tensor;
    type Data = Batch;
    type Stash = Stash;
    type WeightStash = WeightStash;

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, Batch>,
        input: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Output, Stash), ModuleError> {
        let l = &self.layers;
        let (mut h, features) = match (input, &l.embed) {
            (Some(x), _) => (x, None),
            (None, Some(embed)) => (embed.forward(&mb.data.x)?, Some(mb.data.x.clone())),
            (None, None) => return Err("a stage after the first got no input".into()),
        };
        let mut blocks = Vec::with_capacity(l.blocks.len());
        for b in &l.blocks {
            let (y, s) = b.forward(&h)?;
            blocks.push(s);
            h = y;
        }
        let Some(head) = &l.head else {
            let stash = Stash {
                features,
                blocks,
                head: None,
            };
            return Ok((Output::Hidden(h), stash));
        };
        // The loss and its gradient, both times the loss scale.
        let logits = head.forward(&h)?;
        let (loss, probs) = cross_entropy(&logits, &mb.data.labels, mb.loss_scale)?;
        let dlogits = cross_entropy_backward(probs, &mb.data.labels, mb.loss_scale)?;
        let stash = Stash {
            features,
            blocks,
            head: Some((h, dlogits)),
        };
        Ok((Output::Loss(loss), stash))
    }

    fn backward_input(
        &mut self,
        stash: Stash,
        grad_out: Option<Tensor>,
        _: &mut dyn TpReduce,
    ) -> Result<(Option<Tensor>, WeightStash), ModuleError> {
        let l = &self.layers;
        let mut dy = match (grad_out, &stash.head, &l.head) {
            (Some(g), _, _) => g,
            (None, Some((_, dlogits)), Some(head)) => head.backward_input(dlogits)?,
            _ => return Err("no output gradient".into()),
        };
        let mut blocks = Vec::with_capacity(stash.blocks.len());
        for (b, s) in l.blocks.iter().zip(stash.blocks).rev() {
            let (dx, ws) = b.backward_input(s, dy)?;
            blocks.push(ws);
            dy = dx;
        }
        let (grad_in, embed) = match stash.features {
            Some(x) => (None, Some((x, dy))),
            None => (Some(dy), None),
        };
        let ws = WeightStash {
            embed,
            blocks,
            head: stash.head,
        };
        Ok((grad_in, ws))
    }

    fn backward_weight(&mut self, ws: WeightStash) -> Result<(), ModuleError> {
        let l = &mut self.layers;
        if let (Some((h, dlogits)), Some(head)) = (&ws.head, &mut l.head) {
            head.backward_weight(h, dlogits)?;
        }
        for (b, s) in l.blocks.iter_mut().rev().zip(ws.blocks) {
            b.backward_weight(s)?;
        }
        if let (Some((x, dy)), Some(embed)) = (&ws.embed, &mut l.embed) {
            embed.backward_weight(x, dy)?;
        }
        Ok(())
    }

    // The parameter half, over the derived `Parameters`: one line each.

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

    // For the measured memory (parameters and gradients the runtime counts from the flat
    // views; the optimizer's state only the module knows).
    fn optimizer_state_bytes(&self) -> usize {
        self.opt.state_bytes()
    }
}

// ---- Training it: one `run` call, on any mesh; a mesh of one device is the reference. ----

/// The losses of `opts.steps` steps on `mesh` under `tt`.
pub fn train(mesh: Mesh, tt: &Checked, opts: &RunOptions) -> Result<Vec<f32>, ModuleError> {
    let stages = tt.num_stages() as usize;
    let mut losses = Vec::new();
    run(
        mesh,
        tt,
        |_, s| Stage::new(s as usize, stages),
        batch,
        opts,
        |step| losses.push(step.loss.unwrap_or(f32::NAN)),
    )?;
    Ok(losses)
}

/// The reference: the same global batch of `microbatches` (`dp * m`) on one device.
pub fn one_device(microbatches: u32, opts: &RunOptions) -> Result<Vec<f32>, ModuleError> {
    let tt = Checked::new(generate(&ScheduleSpec::new(
        ScheduleKind::GPipe,
        1,
        1,
        microbatches,
        None,
    )?))?;
    train(Mesh::new(1, 1, 1)?, &tt, opts)
}

/// Whether two losses agree within 1e-5, relative.
pub fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

#[allow(dead_code)]
fn main() -> Result<(), ModuleError> {
    let (pp, dp, m, steps) = (2, 2, 4, 20);
    let tt = Checked::new(generate(&ScheduleSpec::new(
        ScheduleKind::ZbH1,
        pp as u32,
        1,
        m,
        None,
    )?))?;
    let opts = RunOptions {
        steps,
        adamw: AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        },
        ..RunOptions::default()
    };
    let piped = train(Mesh::new(pp, 1, dp)?, &tt, &opts)?;
    let single = one_device(dp as u32 * m, &opts)?;
    for (step, (a, b)) in piped.iter().zip(&single).enumerate().step_by(5) {
        println!("step {step:2}: {pp} devices x {dp} replicas {a:.6}  one device {b:.6}");
    }
    let equal =
        piped.len() == single.len() && piped.iter().zip(&single).all(|(a, b)| close(*a, *b));
    if !equal || single[single.len() - 1] >= single[0] {
        eprintln!(
            "error: {} on {pp} devices x {dp} replicas does not match one device (or does not train)",
            tt.name
        );
        std::process::exit(1);
    }
    println!(
        "ok: {} on {pp} devices x {dp} replicas equals one device for {steps} steps",
        tt.name
    );
    Ok(())
}
