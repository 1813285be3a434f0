//! Tensor parallelism for a layer list (issue 33): a residual model of the user's own layers
//! and the kernels' `Mlp`, built from each rank's `TpShard`, trains on tp 2 x pp 2 x dp 2 and
//! tp 4 x pp 2 to one device's losses, each rank holding its shard's parameter bytes; a list
//! whose layers cannot shard is refused on tp 2 before step 0, naming them. One rank's
//! profile of the list records its shard's bytes, and the memory predicted from it is the
//! tp 2 run's to the byte.

// One device's cuts are a list of one range, as `LayerStage::part` takes them.
#![allow(clippy::single_range_in_vec_init)]

use pipewright_schedule::Checked;
use std::ops::Range;

use pipewright_kernels::layers::{
    Linear, Mlp, MlpStash, MlpWeightStash, NoTp, Parameters, RmsNorm, TpReduce, TpShard,
};
use pipewright_kernels::{Backend, Cpu, Tensor};
use pipewright_model::layer_profile::LayerProfile;
use pipewright_model::memory::{predict_layers, LayerMemoryConfig};
use pipewright_runtime::split::{
    cut, layer_profile_tp, Balance, BoxedLayer, Layer, LayerStage, TpLayout,
};
use pipewright_runtime::{run, Coord, Mesh, MicrobatchId, ModuleError, RunOptions, StepRecord};
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec};

type NormStash = <Cpu as Backend>::NormStash;

const D: usize = 16;
const FFN: usize = 32;
const LAYERS: usize = 7;

/// A small projection kept whole on every TP rank, on purpose.
#[derive(Parameters)]
#[parameters(lin)]
struct Proj {
    lin: Linear,
}

impl Layer for Proj {
    type Stash = Tensor;
    type WeightStash = (Tensor, Tensor);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Tensor), ModuleError> {
        Ok((self.lin.forward(x)?, x.clone()))
    }

    fn backward_input(
        &mut self,
        x: Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, (Tensor, Tensor)), ModuleError> {
        Ok((self.lin.backward_input(dy)?, (x, dy.clone())))
    }

    fn backward_weight(&mut self, (x, dy): (Tensor, Tensor)) -> Result<(), ModuleError> {
        Ok(self.lin.backward_weight(&x, &dy)?)
    }

    fn tp_layout(&self) -> TpLayout {
        TpLayout::Replicated
    }
}

/// `x + mlp(rms_norm(x))`, its MLP this rank's shard: the user's layer takes the TP group
/// through `forward_tp` and `backward_input_tp`.
#[derive(Parameters)]
#[parameters(norm, mlp)]
struct Block {
    norm: RmsNorm,
    mlp: Mlp,
}

fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, ModuleError> {
    let sum = a.data().iter().zip(b.data()).map(|(x, y)| x + y).collect();
    Ok(Tensor::new(a.shape(), sum)?)
}

impl Layer for Block {
    type Stash = (NormStash, MlpStash);
    type WeightStash = (Tensor, NormStash, MlpWeightStash);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Self::Stash), ModuleError> {
        self.forward_tp(x, &mut NoTp)
    }

    fn backward_input(
        &mut self,
        s: Self::Stash,
        dy: &Tensor,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError> {
        self.backward_input_tp(s, dy, &mut NoTp)
    }

    fn backward_weight(&mut self, (dh, ns, mws): Self::WeightStash) -> Result<(), ModuleError> {
        self.norm.backward_weight(&dh, &ns)?;
        Ok(self.mlp.backward_weight(mws)?)
    }

    fn tp_layout(&self) -> TpLayout {
        TpLayout::Sharded
    }

    fn forward_tp(
        &mut self,
        x: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, Self::Stash), ModuleError> {
        let (h, ns) = self.norm.forward(x)?;
        let (m, ms) = self.mlp.forward(h, tp)?;
        Ok((add(x, &m)?, (ns, ms)))
    }

    fn backward_input_tp(
        &mut self,
        (ns, ms): Self::Stash,
        dy: &Tensor,
        tp: &mut dyn TpReduce,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError> {
        let (dh, mws) = self.mlp.backward_input(ms, dy.clone(), tp)?;
        let dx = self.norm.backward_input(&dh, &ns)?;
        Ok((add(dy, &dx)?, (dh, ns, mws)))
    }
}

fn weights(k: usize, rows: usize, cols: usize, salt: usize) -> Result<Tensor, ModuleError> {
    let w = (0..rows * cols).map(|j| ((j * 7 + k * 13 + salt) as f32).sin() / (rows as f32).sqrt());
    Ok(Tensor::new(&[rows, cols], w.collect())?)
}

fn mlp(k: usize, shard: TpShard) -> Result<Mlp, ModuleError> {
    let (w1, w2) = (weights(k, D, FFN, 1)?, weights(k, FFN, D, 2)?);
    let (b1, b2) = (Tensor::zeros(&[FFN]), Tensor::zeros(&[D]));
    Ok(Mlp::from_full(
        &format!("mlp{k}"),
        &w1,
        &b1,
        &w2,
        &b2,
        shard,
    )?)
}

/// Layer `k`: a projection 4 -> 16, four residual blocks, a bare MLP, a head 16 -> 1; the
/// same full weights on every rank, each rank holding `shard`'s part of them.
fn layer(k: usize, shard: TpShard) -> Result<BoxedLayer, ModuleError> {
    Ok(match k {
        0 => Box::new(Proj {
            lin: Linear::new("proj", weights(k, 4, D, 0)?, Some(Tensor::zeros(&[D])))?,
        }),
        1..=4 => Box::new(Block {
            norm: RmsNorm::new(&format!("norm{k}"), D),
            mlp: mlp(k, shard)?,
        }),
        5 => Box::new(mlp(k, shard)?),
        _ => Box::new(Proj {
            lin: Linear::new("head", weights(k, D, 1, 0)?, None)?,
        }),
    })
}

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

fn opts() -> RunOptions {
    RunOptions {
        steps: 4,
        ..RunOptions::default()
    }
}

/// Every step's record of the model cut at `cuts` on `mesh`, `m` microbatches per replica.
fn train(mesh: Mesh, cuts: &[Range<usize>], kind: ScheduleKind, m: u32) -> Vec<StepRecord> {
    let tt = generate(&ScheduleSpec::new(kind, cuts.len() as u32, 1, m, None).unwrap());
    let make = |c: Coord, s: u32| {
        let shard = TpShard::new(c.tp, mesh.tp)?;
        LayerStage::part(cuts, s, |k| layer(k, shard), features, mse)
    };
    let mut steps = Vec::new();
    run(
        mesh,
        &Checked::new(tt.clone()).unwrap(),
        make,
        rows,
        &opts(),
        |s| steps.push(s.clone()),
    )
    .unwrap();
    steps
}

fn losses(steps: &[StepRecord]) -> Vec<f32> {
    steps.iter().map(|s| s.loss.unwrap()).collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{what}: {got:?} vs one device {want:?}"
        );
    }
    assert!(want.last() < want.first(), "it learns: {want:?}");
}

/// Parameter bytes of stage 0 (layers 0..4) on one TP rank of `tp`.
fn stage_0_bytes(tp: usize) -> u64 {
    let mlp = D * FFN / tp + FFN / tp + FFN * D / tp + D; // fc2's bias is replicated
    4 * (4 * D + D + 3 * (D + mlp)) as u64
}

#[test]
fn tp_2_pp_2_dp_2_layer_list_equals_one_device_with_sharded_parameter_bytes() {
    let cuts = [0..4, 4..LAYERS];
    let one = losses(&train(
        Mesh::new(1, 1, 1).unwrap(),
        &[0..LAYERS],
        ScheduleKind::GPipe,
        8,
    ));
    let steps = train(
        Mesh::new(2, 2, 2).unwrap(),
        &cuts,
        ScheduleKind::OneFOneB,
        4,
    );
    assert_close(&losses(&steps), &one, "tp 2 x pp 2 x dp 2");
    // Ranks 0..4 are pipeline device 0 (stage 0): each holds its TP shard.
    for rank in 0..4 {
        assert_eq!(
            steps[0].memory[rank].peak.parameters,
            stage_0_bytes(2),
            "rank {rank}"
        );
    }
    let whole = train(
        Mesh::new(2, 1, 1).unwrap(),
        &cuts,
        ScheduleKind::OneFOneB,
        8,
    );
    assert_eq!(whole[0].memory[0].peak.parameters, stage_0_bytes(1));
    assert_close(&losses(&whole), &one, "pp 2");
}

#[test]
fn tp_4_pp_2_layer_list_equals_one_device() {
    let cuts = [0..4, 4..LAYERS];
    let one = losses(&train(
        Mesh::new(1, 1, 1).unwrap(),
        &[0..LAYERS],
        ScheduleKind::GPipe,
        4,
    ));
    let steps = train(Mesh::new(2, 4, 1).unwrap(), &cuts, ScheduleKind::ZbH1, 4);
    assert_close(&losses(&steps), &one, "tp 4 x pp 2 (zb-h1)");
    assert_eq!(steps[0].memory[3].peak.parameters, stage_0_bytes(4));
}

#[test]
fn a_layer_list_that_cannot_shard_is_refused_on_tp_2_naming_its_layers() {
    let lin = |k: usize| -> Result<BoxedLayer, ModuleError> {
        Ok(Box::new(Linear::new(
            &format!("l{k}"),
            weights(k, if k == 0 { 4 } else { D }, if k == 3 { 1 } else { D }, 0)?,
            None,
        )?))
    };
    let cuts = [0..2, 2..4];
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let make = |_: Coord, s: u32| LayerStage::part(&cuts, s, lin, features, mse);
    let mut steps = 0;
    let e = run(
        Mesh::new(2, 2, 1).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        rows,
        &opts(),
        |_| steps += 1,
    )
    .unwrap_err();
    let line = e.to_string();
    assert_eq!(steps, 0, "{line}");
    // Each pipeline device refuses its own stage; the first to stop is reported.
    let stage0 = "stage 0: tp = 2, but layer 0 (Linear), layer 1 (Linear) hold parameters";
    let stage1 = "stage 1: tp = 2, but layer 2 (Linear), layer 3 (Linear) hold parameters";
    assert!(
        line.starts_with(stage0) || line.starts_with(stage1),
        "{line}"
    );
    assert!(
        line.contains("cannot shard (Layer::tp_layout is TpLayout::Whole)"),
        "{line}"
    );
    // The same list runs on tp 1.
    run(
        Mesh::new(2, 1, 1).unwrap(),
        &Checked::new(tt.clone()).unwrap(),
        make,
        rows,
        &opts(),
        |_| {},
    )
    .unwrap();
}

/// The model's layers as TP rank 0 of `tp` holds them, and one microbatch of 8 rows.
fn rank_0_layers(tp: u32) -> (Vec<BoxedLayer>, Tensor) {
    let shard = TpShard::new(0, tp as usize).unwrap();
    let layers: Vec<BoxedLayer> = (0..LAYERS).map(|k| layer(k, shard).unwrap()).collect();
    let id = MicrobatchId {
        step: 0,
        dp: 0,
        microbatch: 0,
        microbatches: 1,
    };
    (layers, rows(id).unwrap().x)
}

/// Those layers profiled on that microbatch.
fn profiled(tp: u32) -> LayerProfile {
    let (mut layers, sample) = rank_0_layers(tp);
    layer_profile_tp(&mut layers, &sample, 8, 1, "this CPU", tp).unwrap()
}

#[test]
fn a_tp_the_profile_reader_would_refuse_is_refused_when_profiling() {
    let (mut layers, sample) = rank_0_layers(1);
    for tp in [0, 1025] {
        let e = layer_profile_tp(&mut layers, &sample, 8, 1, "this CPU", tp).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("tp {tp} must be from 1 to 1024 (the TP degree the layers are measured at)")
        );
    }
}

#[test]
fn a_tp_2_profile_holds_one_rank_s_bytes_and_predicts_the_tp_2_run_to_the_byte() {
    let (whole, half) = (profiled(1), profiled(2));
    assert_eq!((whole.tp, half.tp), (1, 2));
    for (k, (w, h)) in whole.layers.iter().zip(&half.layers).enumerate() {
        let ratio = h.param_bytes as f64 / w.param_bytes as f64;
        match k {
            // The MLPs' shards: half, but for the replicated norm and output bias.
            1..=5 => assert!((0.5..0.56).contains(&ratio), "layer {k}: {ratio}"),
            _ => assert_eq!(ratio, 1.0, "layer {k}: replicated"),
        }
    }
    // `cut` by parameters weighs what `layer(k)` builds: the rank's shard, as profiled.
    let shard = TpShard::new(0, 2).unwrap();
    let by_params = cut(LAYERS, 2, Balance::Parameters, None, |k| layer(k, shard)).unwrap();
    let profiled: Vec<f64> = half.layers.iter().map(|l| l.params as f64).collect();
    assert_eq!(by_params.weights, profiled);
    let m = 4;
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, m, None).unwrap());
    let cuts = half.cuts(2).unwrap();
    let mesh = Mesh::new(2, 2, 1).unwrap();
    let steps = train(mesh, &cuts, ScheduleKind::OneFOneB, m);
    let cfg = LayerMemoryConfig {
        profile: &half,
        cuts,
        dp: 1,
        microbatch_size: 8,
        zero: 0,
        recompute: RecomputePlan::default(),
    };
    let predicted: Vec<_> = predict_layers(&cfg, &tt)
        .unwrap()
        .iter()
        .map(|d| d.peak)
        .collect();
    let measured = steps.last().unwrap().device_peaks(&mesh);
    assert_eq!(measured, predicted);
    // Both TP ranks of a stage hold the same bytes: the profiled rank's.
    let ranks = &steps.last().unwrap().memory;
    assert_eq!(ranks[0].peak, ranks[1].peak);
}
