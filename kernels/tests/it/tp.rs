//! Tensor-parallel equivalence: a layer split over tp ranks, with the
//! partial sums added, equals the unsharded layer in output and gradients.
//!
//! Tolerance: 1e-5 times the largest magnitude of the reference tensor
//! (at least 1): sharding only changes the order of f32 additions.

use crate::common;

use common::{grads, randn, ThreadReduce};
use pipewright_kernels::gpt::{
    GptConfig, GptStage, Microbatch, MlpKind, NormKind, Positions, StageOutput,
};
use pipewright_kernels::layers::shard::{shard_col_segments, shard_cols, shard_rows};
use pipewright_kernels::layers::{Attention, Mlp, NoTp, Parameters, TpShard};
use pipewright_kernels::Tensor;

fn assert_near(what: &str, got: &Tensor, want: &Tensor) {
    let scale = want.data().iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let diff = got.max_abs_diff(want).unwrap();
    assert!(
        diff <= 1e-5 * scale,
        "{what}: differs by {diff} (scale {scale})"
    );
}

/// Adds the ranks' partial sums in rank order.
fn sum(parts: Vec<Tensor>) -> Tensor {
    let mut it = parts.into_iter();
    let mut acc = it.next().expect("at least one rank");
    it.for_each(|p| acc.add_assign(&p).unwrap());
    acc
}

fn scaled(shape: &[usize], tag: &str) -> Tensor {
    let t = randn(shape, tag);
    let s = 1.0 / (shape[0] as f32).sqrt();
    Tensor::new(shape, t.data().iter().map(|v| v * s).collect()).unwrap()
}

/// The shard of a full gradient that rank `tp` should hold, by parameter name;
/// `kv` is the key/value columns' share of a fused QKV's (1 for multi-head).
fn expected_shard(name: &str, full: &Tensor, tp: TpShard, kv: f64) -> Tensor {
    // A mixture's experts are cut like the MLP (`blocks.1.mlp.experts.3.fc1` as `mlp.fc1`).
    let name = &crate::moe_gpt::as_dense_name(name);
    if name.contains("attn.qkv") {
        let q = (full.cols() as f64 / (1.0 + 2.0 * kv)).round() as usize;
        let k = (full.cols() - q) / 2;
        shard_col_segments(full, &[q, k, k], tp).unwrap()
    } else if name.contains("mlp.gate_up") {
        shard_cols(full, 2, tp).unwrap()
    } else if name.contains("mlp.fc1") {
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

fn compare_grads(what: &str, full: &[(String, Tensor)], shard: &[(String, Tensor)], tp: TpShard) {
    compare_grads_kv(what, full, shard, tp, 1.0)
}

fn compare_grads_kv(
    what: &str,
    full: &[(String, Tensor)],
    shard: &[(String, Tensor)],
    tp: TpShard,
    kv: f64,
) {
    assert_eq!(full.len(), shard.len());
    for ((n, g), (m, s)) in full.iter().zip(shard) {
        assert_eq!(n, m);
        assert_near(
            &format!("{what} {n} rank {}", tp.rank),
            s,
            &expected_shard(n, g, tp, kv),
        );
    }
}

#[test]
fn column_then_row_mlp_matches_unsharded() {
    let (d, f) = (8, 32);
    let (w1, b1, w2, b2) = (
        scaled(&[d, f], "w1"),
        randn(&[f], "b1"),
        scaled(&[f, d], "w2"),
        randn(&[d], "b2"),
    );
    let (x, dy) = (randn(&[2, 5, d], "x"), randn(&[2, 5, d], "dy"));
    let mut full = Mlp::from_full("mlp", &w1, &b1, &w2, &b2, TpShard::SINGLE).unwrap();
    let (y, s) = full.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = full.backward_input(s, dy.clone(), &mut NoTp).unwrap();
    full.backward_weight(ws).unwrap();
    for size in [1, 2, 4] {
        let mut ys = Vec::new();
        let mut dxs = Vec::new();
        let mut shards = Vec::new();
        for rank in 0..size {
            let tp = TpShard::new(rank, size).unwrap();
            let mut m = Mlp::from_full("mlp", &w1, &b1, &w2, &b2, tp).unwrap();
            let (y, s) = m.forward_partial(x.clone()).unwrap();
            let (dx, ws) = m.backward_input_partial(s, dy.clone()).unwrap();
            m.backward_weight(ws).unwrap();
            ys.push(y);
            dxs.push(dx);
            shards.push((tp, m));
        }
        let mut y_tp = sum(ys);
        shards[0].1.fc2.add_bias(&mut y_tp).unwrap();
        assert_near(&format!("mlp output tp={size}"), &y_tp, &y);
        assert_near(&format!("mlp dx tp={size}"), &sum(dxs), &dx);
        for (tp, m) in &shards {
            compare_grads(&format!("mlp tp={size}"), &grads(&full), &grads(m), *tp);
        }
    }
}

#[test]
fn head_split_attention_matches_unsharded() {
    let (d, heads) = (16, 4);
    let (wq, bq) = (scaled(&[d, 3 * d], "wqkv"), randn(&[3 * d], "bqkv"));
    let (wo, bo) = (scaled(&[d, d], "wo"), randn(&[d], "bo"));
    let (x, dy) = (randn(&[2, 6, d], "x"), randn(&[2, 6, d], "dy"));
    let build = |tp| Attention::from_full("attn", heads, &wq, &bq, &wo, &bo, tp).unwrap();
    let mut full = build(TpShard::SINGLE);
    let (y, s) = full.forward(x.clone(), &mut NoTp).unwrap();
    let (dx, ws) = full.backward_input(s, dy.clone(), &mut NoTp).unwrap();
    full.backward_weight(ws).unwrap();
    for size in [1, 2, 4] {
        let (mut ys, mut dxs, mut shards) = (Vec::new(), Vec::new(), Vec::new());
        for rank in 0..size {
            let tp = TpShard::new(rank, size).unwrap();
            let mut a = build(tp);
            let (y, s) = a.forward_partial(x.clone()).unwrap();
            let (dx, ws) = a.backward_input_partial(s, dy.clone()).unwrap();
            a.backward_weight(ws).unwrap();
            ys.push(y);
            dxs.push(dx);
            shards.push((tp, a));
        }
        let mut y_tp = sum(ys);
        shards[0].1.proj.add_bias(&mut y_tp).unwrap();
        assert_near(&format!("attention output tp={size}"), &y_tp, &y);
        assert_near(&format!("attention dx tp={size}"), &sum(dxs), &dx);
        for (tp, a) in &shards {
            compare_grads(
                &format!("attention tp={size}"),
                &grads(&full),
                &grads(a),
                *tp,
            );
        }
    }
}

#[test]
fn attention_rejects_bad_head_splits() {
    let (wq, bq, wo, bo) = (
        randn(&[8, 24], "a"),
        randn(&[24], "b"),
        randn(&[8, 8], "c"),
        randn(&[8], "d"),
    );
    let tp3 = TpShard::new(0, 3).unwrap();
    assert!(Attention::from_full("a", 4, &wq, &bq, &wo, &bo, tp3).is_err());
    assert!(Attention::from_full("a", 3, &wq, &bq, &wo, &bo, TpShard::SINGLE).is_err());
}

/// The whole GPT on one rank vs `size` ranks on threads with a real
/// (in-process) all-reduce: same loss, same gradients shard by shard.
#[test]
fn gpt_on_tp_threads_matches_whole() {
    check_gpt_on_tp_threads(&GptConfig::new(11, 6, 16, 4, 2), &[2, 4]);
}

/// The same for a Llama-shaped GPT: grouped-query attention (2 key/value heads
/// for 4 query heads, so each of 2 ranks holds one group) with rotary positions
/// (each rank turns its own heads), a SwiGLU MLP (gate
/// and up split by columns together, down by rows), RMSNorm; and GeGLU with
/// multi-query attention (one key/value head, so TP 1 only: the TP size must
/// divide the key/value heads).
#[test]
fn llama_shaped_gpt_on_tp_threads_matches_whole() {
    let gqa = GptConfig {
        kv_heads: 2,
        d_ff: 24,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        positions: Positions::ROTARY,
        ..GptConfig::new(11, 6, 16, 4, 2)
    };
    check_gpt_on_tp_threads(&gqa, &[2]);
    let err = GptStage::new(&gqa, 9, 0, 1, TpShard::new(0, 4).unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .contains("key/value heads (2) must be divisible by the tensor-parallel size 4"),
        "{err}"
    );
    let mqa = GptConfig {
        kv_heads: 1,
        mlp: MlpKind::GeGlu,
        ..gqa
    };
    check_gpt_on_tp_threads(&mqa, &[]);
}

pub(crate) fn check_gpt_on_tp_threads(cfg: &GptConfig, sizes: &[usize]) {
    let cfg = *cfg;
    let kv = cfg.kv_heads as f64 / cfg.n_heads as f64;
    let tokens: Vec<u32> = (0..12).map(|i| (i * 5 % 11) as u32).collect();
    let targets: Vec<u32> = (0..12).map(|i| (i * 3 % 11) as u32).collect();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 6,
        loss_scale: 1.0,
    };
    let mut whole = GptStage::whole(&cfg, 9).unwrap();
    let (out, stash) = whole.forward(&mb, None, &mut NoTp).unwrap();
    let StageOutput::Loss(loss) = out else {
        panic!("whole model returns a loss")
    };
    whole.backward(stash, None, &mut NoTp).unwrap();
    let full_grads = grads(&whole);
    for &size in sizes {
        let results: Vec<(f32, Vec<(String, Tensor)>)> = std::thread::scope(|s| {
            let handles: Vec<_> = ThreadReduce::group(size)
                .into_iter()
                .enumerate()
                .map(|(rank, mut comm)| {
                    s.spawn(move || {
                        let tp = TpShard::new(rank, size).unwrap();
                        let mut st = GptStage::new(&cfg, 9, 0, 1, tp).unwrap();
                        let (out, stash) = st.forward(&mb, None, &mut comm).unwrap();
                        st.backward(stash, None, &mut comm).unwrap();
                        let StageOutput::Loss(l) = out else {
                            panic!("loss")
                        };
                        (l, grads(&st))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (l, g)) in results.iter().enumerate() {
            assert!(
                (l - loss).abs() <= 1e-5 * loss.abs(),
                "tp={size} loss {l} vs {loss}"
            );
            let tp = TpShard::new(rank, size).unwrap();
            compare_grads_kv(&format!("gpt tp={size}"), &full_grads, g, tp, kv);
        }
        // Replicated parameters' gradients agree bit for bit across ranks.
        let first: Vec<&Tensor> = results[0].1.iter().map(|(_, g)| g).collect();
        for (_, g) in &results[1..] {
            for ((n, a), b) in g.iter().zip(&first) {
                if n.contains("ln") || n.contains("embed") || n.contains("head") {
                    assert_eq!(a, *b, "{n}");
                }
            }
        }
        assert_eq!(results.len(), size);
        let total: usize = results
            .iter()
            .map(|(_, g)| g.iter().map(|(_, t)| t.numel()).sum::<usize>())
            .sum();
        assert!(
            total > whole.num_params(),
            "replicated parts count once per rank"
        );
    }
}
