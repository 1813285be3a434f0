//! The one-device reference of the equality tests: the whole GPT trained on the whole global
//! batch, and the comparison of a mesh's final parameters with it, shard by shard.

use std::collections::HashMap;

use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, StageOutput};
use pipewright_kernels::layers::shard::{shard_col_segments, shard_cols, shard_rows};
use pipewright_kernels::layers::{NoTp, Param, Parameters, TpShard};
use pipewright_kernels::optim::AdamW;
use pipewright_kernels::Tensor;
use pipewright_runtime::data::progression_batch;
use pipewright_runtime::{FinalParams, TrainConfig};

/// One device, the whole global batch as `dp * m` accumulated microbatches, `steps` steps:
/// each step's loss and the trained model.
pub fn single_device(cfg: &TrainConfig, m: u32, steps: u64) -> (Vec<f32>, GptStage) {
    let mut whole = GptStage::whole(&cfg.model, cfg.seed).unwrap();
    let mut opt = AdamW::new(whole.num_params(), cfg.run.adamw);
    let n = cfg.mesh.dp as u64 * u64::from(m);
    let mut losses = Vec::new();
    for step in 0..steps {
        let mut loss = 0.0;
        for j in 0..n {
            let (tokens, targets) = progression_batch(
                cfg.seed,
                step,
                j,
                cfg.microbatch_size,
                cfg.model.seq_len,
                cfg.model.vocab,
            );
            let mb = Microbatch {
                tokens: &tokens,
                targets: &targets,
                seq: cfg.model.seq_len,
                loss_scale: 1.0 / n as f32,
            };
            let (out, stash) = whole.forward(&mb, None, &mut NoTp).unwrap();
            let StageOutput::Loss(l) = out else {
                panic!("whole model ends in a loss")
            };
            loss += l;
            whole.backward(stash, None, &mut NoTp).unwrap();
        }
        opt.step(&mut whole).unwrap();
        whole.zero_grad();
        losses.push(loss);
    }
    (losses, whole)
}

/// What a TP shard of a whole-model parameter holds (the split documented in kernels'
/// shard.rs): QKV by its Q, K and V segments, a gated MLP's fused gate and up as two
/// segments, the output projections by rows, the rest replicated.
pub fn shard_of(model: &GptConfig, name: &str, full: &Tensor, tp: TpShard) -> Tensor {
    let kv = model.kv_heads * model.head_dim();
    // A mixture's experts are cut as the MLP is (`mlp.experts.3.fc1.` as `mlp.fc1.`).
    let name = &name.replace(".shared.", ".");
    let name = &match name.split_once(".experts.") {
        Some((head, rest)) => format!("{head}.{}", rest.split_once('.').map_or(rest, |r| r.1)),
        None => name.clone(),
    };
    if name.contains("attn.qkv.") {
        shard_col_segments(full, &[model.d_model, kv, kv], tp).unwrap()
    } else if name.contains("mlp.gate_up.") {
        shard_cols(full, 2, tp).unwrap()
    } else if name.contains("mlp.fc1.") {
        shard_cols(full, 1, tp).unwrap()
    } else if ["attn.proj.weight", "mlp.fc2.weight", "mlp.down.weight"]
        .iter()
        .any(|n| name.ends_with(n))
    {
        shard_rows(full, tp).unwrap()
    } else {
        full.clone()
    }
}

/// `|a - b| <= 1e-5` relative to the larger (at least 1).
pub fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

/// Every stage and shard of `got` holds `whole`'s parameters (within [`close`]).
pub fn check_params(
    cfg: &TrainConfig,
    stages: usize,
    got: &FinalParams,
    whole: &GptStage,
    what: &str,
) {
    let mut full: HashMap<String, Tensor> = HashMap::new();
    whole.visit(&mut |p: &Param| {
        full.insert(p.name.clone(), p.value.clone());
    });
    assert_eq!(
        got.len(),
        stages * cfg.mesh.tp,
        "{what}: one parameter set per stage and shard"
    );
    for (&(stage, tp), flat) in got {
        let shard = TpShard::new(tp, cfg.mesh.tp).unwrap();
        let layout = GptStage::new(&cfg.model, cfg.seed, stage as usize, stages, shard).unwrap();
        let mut offset = 0;
        layout.visit(&mut |p: &Param| {
            let want = shard_of(&cfg.model, &p.name, &full[&p.name], shard);
            let n = want.numel();
            let have = &flat[offset..offset + n];
            for (i, (&a, &b)) in have.iter().zip(want.data()).enumerate() {
                assert!(
                    close(a, b),
                    "{what}: stage {stage} tp {tp} {}[{i}]: {a} vs {b}",
                    p.name
                );
            }
            offset += n;
        });
        assert_eq!(offset, flat.len(), "{what}: stage {stage} tp {tp}");
    }
}
