//! The mistakes a user's own layer-list model can make, each refused before step 1 naming
//! the user's layer, parameter, stage or microbatch (issue 33): a layer that never stores
//! its weight gradient, a data function of the thread (its inputs or its targets), a
//! wrong-shaped input gradient, a hand-off of the wrong width, replicas built apart. And the same model without the
//! mistake is not refused.

// One device's cuts are a list of one range, as `LayerStage::part` takes them.
#![allow(clippy::single_range_in_vec_init)]

use pipewright_schedule::Checked;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use pipewright_kernels::layers::{Linear, Parameters};
use pipewright_kernels::Tensor;
use pipewright_runtime::split::{BoxedLayer, Layer, LayerStage};
use pipewright_runtime::{run, Coord, Mesh, MicrobatchId, ModuleError, RunOptions, RuntimeError};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

/// What a layer gets wrong.
#[derive(Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Computes its weight gradient and drops it.
    DropsGrad,
    /// Returns an input gradient one column short.
    ShortGrad,
}

#[derive(Parameters)]
#[parameters(lin)]
struct Dense {
    lin: Linear,
    bug: Bug,
}

impl Layer for Dense {
    type Stash = Tensor;
    type WeightStash = (Tensor, Tensor);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Tensor), ModuleError> {
        let mut y = self.lin.forward(x)?;
        y.data_mut().iter_mut().for_each(|v| *v = v.tanh());
        Ok((y.clone(), x.clone()))
    }

    fn backward_input(
        &mut self,
        x: Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, (Tensor, Tensor)), ModuleError> {
        let dx = self.lin.backward_input(dy)?;
        if self.bug == Bug::ShortGrad {
            let (r, c) = (dx.shape()[0], dx.shape()[1] - 1);
            return Ok((Tensor::zeros(&[r, c]), (x, dy.clone())));
        }
        Ok((dx, (x, dy.clone())))
    }

    fn backward_weight(&mut self, (x, dy): (Tensor, Tensor)) -> Result<(), ModuleError> {
        if self.bug == Bug::DropsGrad {
            // The gradient a user computes into a local and never adds to the parameter.
            let mut scratch = self.lin.clone();
            scratch.backward_weight(&x, &dy)?;
            return Ok(());
        }
        Ok(self.lin.backward_weight(&x, &dy)?)
    }
}

/// Layer `k` of 4, `widths[k]` in and `widths[k + 1]` out; `bug` on layer 2.
fn layer(k: usize, widths: [usize; 5], bug: Bug) -> Result<BoxedLayer, ModuleError> {
    let (i, o) = (widths[k], widths[k + 1]);
    let w = (0..i * o).map(|j| ((j * 7 + k) as f32).sin() / (i as f32).sqrt());
    let lin = Linear::new(&format!("l{k}"), Tensor::new(&[i, o], w.collect())?, None)?;
    let bug = if k == 2 { bug } else { Bug::None };
    Ok(Box::new(Dense { lin, bug }))
}

const WIDTHS: [usize; 5] = [4, 16, 16, 16, 1];

struct Rows {
    x: Tensor,
    y: Vec<f32>,
}

fn rows(id: MicrobatchId) -> Result<Rows, ModuleError> {
    let x: Vec<f32> = (0..32)
        .map(|i| ((id.global() * 32 + i) as f32 * 0.37).sin())
        .collect();
    let y = x.chunks(4).map(|r| (r[0] - r[3]) / 2.0).collect();
    Ok(Rows {
        x: Tensor::new(&[8, 4], x)?,
        y,
    })
}

fn features(rows: &Rows) -> Result<Tensor, ModuleError> {
    Ok(rows.x.clone())
}

fn mse(pred: &Tensor, rows: &Rows) -> Result<(f32, Tensor), ModuleError> {
    let s = 1.0 / rows.y.len() as f32;
    let err: Vec<f32> = pred
        .data()
        .iter()
        .zip(&rows.y)
        .map(|(p, t)| p - t)
        .collect();
    let grad = Tensor::new(pred.shape(), err.iter().map(|e| 2.0 * s * e).collect())?;
    Ok((s * err.iter().map(|e| e * e).sum::<f32>(), grad))
}

/// Train 2 steps of the 4-layer model cut at `cuts` on `mesh` with 1F1B; the steps run.
fn train(
    mesh: Mesh,
    cuts: &[Range<usize>],
    make: impl Fn(Coord, u32) -> Result<LayerStage<Rows>, ModuleError> + Sync,
    data: impl Fn(MicrobatchId) -> Result<Rows, ModuleError> + Sync,
    opts: &RunOptions,
) -> (Result<(), RuntimeError>, u64) {
    let tt = generate(
        &ScheduleSpec::new(ScheduleKind::OneFOneB, cuts.len() as u32, 1, 4, None).unwrap(),
    );
    let mut steps = 0;
    let r = run(
        mesh,
        &Checked::new(tt.clone()).unwrap(),
        make,
        data,
        opts,
        |_| steps += 1,
    )
    .map(|_| ());
    (r, steps)
}

fn opts() -> RunOptions {
    RunOptions {
        steps: 2,
        ..RunOptions::default()
    }
}

fn part(
    cuts: &[Range<usize>],
    s: u32,
    widths: [usize; 5],
    bug: Bug,
) -> Result<LayerStage<Rows>, ModuleError> {
    LayerStage::part(cuts, s, |k| layer(k, widths, bug), features, mse)
}

#[test]
fn a_correct_model_is_not_refused_on_pp_2_dp_2_nor_on_one_device() {
    let cuts = [0..2, 2..4];
    let (r, steps) = train(
        Mesh::new(2, 1, 2).unwrap(),
        &cuts,
        |_, s| part(&cuts, s, WIDTHS, Bug::None),
        rows,
        &opts(),
    );
    r.unwrap();
    assert_eq!(steps, 2);
    let one = [0..4];
    let (r, _) = train(
        Mesh::new(1, 1, 1).unwrap(),
        &one,
        |_, s| part(&one, s, WIDTHS, Bug::None),
        rows,
        &opts(),
    );
    r.unwrap();
}

#[test]
fn a_layer_that_never_stores_its_weight_gradient_is_refused_naming_it_and_its_stage() {
    let cuts = [0..2, 2..4];
    let make = |_, s| part(&cuts, s, WIDTHS, Bug::DropsGrad);
    let (r, steps) = train(Mesh::new(2, 1, 1).unwrap(), &cuts, make, rows, &opts());
    let line = r.expect_err("the dropped gradient is refused").to_string();
    assert_eq!(steps, 0, "no step finished: {line}");
    assert!(
        line.contains("stage 1: parameter l2.weight (layer 2, Dense) got no gradient in step 0"),
        "{line}"
    );
    // The one-device reference with the same bug is refused as well: no silent agreement.
    let one = [0..4];
    let (r, _) = train(
        Mesh::new(1, 1, 1).unwrap(),
        &one,
        |_, s| part(&one, s, WIDTHS, Bug::DropsGrad),
        rows,
        &opts(),
    );
    let line = r.expect_err("refused on one device").to_string();
    assert!(
        line.contains("stage 0: parameter l2.weight (layer 2, Dense)"),
        "{line}"
    );
    // A parameter named in allow_unused passes (a layer frozen at step 0 on purpose).
    let allow = RunOptions {
        allow_unused: vec!["l2.weight".into()],
        ..opts()
    };
    let (r, steps) = train(Mesh::new(2, 1, 1).unwrap(), &cuts, make, rows, &allow);
    r.unwrap();
    assert_eq!(steps, 2);
}

#[test]
fn a_data_function_of_the_thread_is_refused_at_step_0_naming_the_microbatch_and_ranks() {
    // A stream's next item, whichever thread asks: each rank draws its own items.
    let next = AtomicU64::new(0);
    let by_thread = |id: MicrobatchId| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        rows(MicrobatchId {
            microbatch: n as u32,
            ..id
        })
    };
    let cuts = [0..2, 2..4];
    let (r, steps) = train(
        Mesh::new(2, 1, 1).unwrap(),
        &cuts,
        |_, s| part(&cuts, s, WIDTHS, Bug::None),
        by_thread,
        &opts(),
    );
    let line = r.expect_err("thread-dependent data is refused").to_string();
    assert_eq!(steps, 0, "{line}");
    assert!(line.contains("step 0"), "{line}");
    assert!(
        line.contains(
            "the data function gave ranks 0 and 1 different data for microbatch 0 of step 0"
        ),
        "{line}"
    );
}

#[test]
fn targets_of_the_thread_are_refused_at_step_0_though_the_inputs_agree() {
    // The inputs follow the id; the targets come from a stream each rank draws from.
    let next = AtomicU64::new(0);
    let targets_by_thread = |id: MicrobatchId| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let drawn = rows(MicrobatchId {
            microbatch: n as u32,
            ..id
        })?;
        Ok(Rows {
            y: drawn.y,
            ..rows(id)?
        })
    };
    let cuts = [0..2, 2..4];
    let (r, steps) = train(
        Mesh::new(2, 1, 1).unwrap(),
        &cuts,
        |_, s| part(&cuts, s, WIDTHS, Bug::None),
        targets_by_thread,
        &opts(),
    );
    let line = r
        .expect_err("thread-dependent targets are refused")
        .to_string();
    assert_eq!(steps, 0, "{line}");
    assert!(
        line.contains(
            "the data function gave ranks 0 and 1 different targets (what the loss reads) for \
             microbatch 0 of step 0"
        ),
        "{line}"
    );
}

#[test]
fn a_wrong_shaped_input_gradient_is_blamed_on_the_layer_that_returned_it() {
    let one = [0..4];
    let (r, _) = train(
        Mesh::new(1, 1, 1).unwrap(),
        &one,
        |_, s| part(&one, s, WIDTHS, Bug::ShortGrad),
        rows,
        &opts(),
    );
    let line = r.expect_err("refused").to_string();
    assert!(
        line.contains("layer 2 (Dense): backward_input returned an input gradient of shape [8, 15], but its forward's input had shape [8, 16]"),
        "{line}"
    );
}

#[test]
fn a_hand_off_of_the_wrong_width_names_both_stages_and_the_shape() {
    // Stage 0 ends in a layer of width 32; stage 1's first layer takes 16.
    let cuts = [0..2, 2..4];
    let make = |_, s: u32| {
        let widths = if s == 0 { [4, 16, 32, 16, 1] } else { WIDTHS };
        part(&cuts, s, widths, Bug::None)
    };
    let (r, _) = train(Mesh::new(2, 1, 1).unwrap(), &cuts, make, rows, &opts());
    let line = r.expect_err("refused").to_string();
    assert!(
        line.contains("layer 2 (Dense), the first of stage 1, cannot take stage 0's hand-off of shape [8, 32]"),
        "{line}"
    );
}

#[test]
fn replicas_built_apart_are_refused_naming_the_parameter() {
    let cuts = [0..2, 2..4];
    let make = |c: Coord, s: u32| {
        let mut stage = part(&cuts, s, WIDTHS, Bug::None)?;
        if c.dp == 1 && s == 1 {
            // A seed from the replica index: replica 1's layer 3 starts elsewhere.
            let mut first = true;
            stage_params_mut(&mut stage, &mut |name, v| {
                if first && name == "l3.weight" {
                    v[0] += 1.0;
                    first = false;
                }
            });
        }
        Ok(stage)
    };
    let (r, steps) = train(Mesh::new(2, 1, 2).unwrap(), &cuts, make, rows, &opts());
    let line = r.expect_err("refused").to_string();
    assert_eq!(steps, 0);
    assert!(line.contains("stage 1: data-parallel replicas 0 and 1 build it with different parameters (l3.weight (layer 3, Dense)[0] is"), "{line}");
}

/// Visit a stage's parameters by name through its flat views.
fn stage_params_mut(stage: &mut LayerStage<Rows>, f: &mut dyn FnMut(&str, &mut [f32])) {
    use pipewright_runtime::StageModule;
    let names = stage.parameter_names().unwrap();
    let mut flat = stage.flat_params().unwrap().unwrap();
    let mut off = 0;
    for n in &names {
        let short = n.name.split(' ').next().unwrap();
        f(short, &mut flat[off..off + n.numel]);
        off += n.numel;
    }
    stage
        .set_flat_params(Tensor::new(&[flat.len()], flat).unwrap())
        .unwrap();
}

/// The reference GPT names its parameters as the kernels do: replicas built from seeds of
/// their own are refused naming the first parameter that differs, not a flat index.
#[test]
fn gpt_replicas_built_apart_are_refused_naming_the_gpt_s_parameter() {
    use pipewright_kernels::gpt::GptConfig;
    use pipewright_kernels::layers::TpShard;
    use pipewright_runtime::train::gpt_data;
    use pipewright_runtime::{GptModule, StageModule, TrainConfig};

    let mesh = Mesh::new(1, 1, 2).unwrap();
    let cfg = TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 4),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 5,
        run: opts(),
    };
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 2, None).unwrap());
    let make = |c: Coord, s: u32| {
        GptModule::new(
            &cfg.model,
            cfg.seed + c.dp as u64,
            s as usize,
            1,
            TpShard::SINGLE,
        )
    };
    let r = run(
        mesh,
        &Checked::new(tt.clone()).unwrap(),
        make,
        |id| Ok(gpt_data(&cfg, id)),
        &opts(),
        |_| {},
    );
    let line = r.expect_err("refused").to_string();
    assert!(
        line.contains("stage 0: data-parallel replicas 0 and 1 build it with different parameters (embed.wte[0] is"),
        "{line}"
    );
    // Every block's weights by their place: what the unused-parameter check names too.
    let m = make(
        Coord {
            pp: 0,
            tp: 0,
            dp: 0,
        },
        0,
    )
    .unwrap();
    let names: Vec<String> = m
        .parameter_names()
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "blocks.1.attn.qkv.weight"),
        "{names:?}"
    );
}
