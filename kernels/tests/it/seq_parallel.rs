//! Sequence parallelism: a GPT stage on tp ranks with its residual stream cut
//! along the sequence equals the same ranks without the cut, in loss and in
//! every gradient (after the norms' gradients are summed over the group), and
//! keeps a smaller stash and hands on `t` times fewer bytes.

use crate::common;

use common::{grads, ThreadReduce};
use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, Positions, StageOutput};
use pipewright_kernels::layers::TpShard;
use pipewright_kernels::{Footprint, Tensor};

/// What one rank of a two-stage pipeline saw: loss, gradients of both
/// stages, stash bytes of both stages, the hand-off's element count.
struct Rank {
    loss: f32,
    grads: Vec<(String, Tensor)>,
    stash: [usize; 2],
    handoff: usize,
}

/// Both stages of a 2-stage pipeline on one TP rank, run in sequence (the
/// hand-off passed directly), with or without sequence parallelism.
fn two_stages(
    cfg: &GptConfig,
    mb: &Microbatch<'_>,
    comm: &mut ThreadReduce,
    tp: TpShard,
    sp: bool,
) -> Rank {
    let mut st: Vec<GptStage> = (0..2)
        .map(|s| GptStage::new(cfg, 3, s, 2, tp).unwrap())
        .collect();
    for s in &mut st {
        s.set_sequence_parallel(sp.then_some(tp)).unwrap();
    }
    let (h, s0) = st[0].forward(mb, None, comm).unwrap();
    let StageOutput::Hidden(h) = h else {
        panic!("hidden")
    };
    let handoff = h.numel();
    let (l, s1) = st[1].forward(mb, Some(h), comm).unwrap();
    let StageOutput::Loss(loss) = l else {
        panic!("loss")
    };
    let stash = [s0.bytes(), s1.bytes()];
    let g = st[1].backward(s1, None, comm).unwrap();
    st[0].backward(s0, g, comm).unwrap();
    let mut out = Vec::new();
    for s in &mut st {
        s.reduce_sequence_parallel_grads(comm).unwrap();
        out.extend(grads(s));
    }
    Rank {
        loss,
        grads: out,
        stash,
        handoff,
    }
}

fn run(cfg: GptConfig, mb: Microbatch<'_>, size: usize, sp: bool) -> Vec<Rank> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ThreadReduce::group(size)
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                s.spawn(move || {
                    let tp = TpShard::new(rank, size).unwrap();
                    two_stages(&cfg, &mb, &mut comm, tp, sp)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Learned positions, and rotary ones: attention gathers the whole sequence before its
/// projection, so every rank turns each row by its place in the whole sequence, not in
/// the rank's slice.
#[test]
fn sequence_parallel_equals_tensor_parallel() {
    let learned = GptConfig::new(13, 8, 16, 4, 4);
    let rotary = GptConfig {
        positions: Positions::ROTARY,
        ..learned
    };
    for cfg in [learned, rotary] {
        sequence_parallel_equals_tensor_parallel_in(cfg);
    }
}

fn sequence_parallel_equals_tensor_parallel_in(cfg: GptConfig) {
    let tokens: Vec<u32> = (0..24).map(|i| (i * 5 % 13) as u32).collect();
    let targets: Vec<u32> = (0..24).map(|i| (i * 3 % 13) as u32).collect();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    for size in [2, 4] {
        let tp = run(cfg, mb, size, false);
        let sp = run(cfg, mb, size, true);
        for (rank, (a, b)) in tp.iter().zip(&sp).enumerate() {
            assert!(
                (a.loss - b.loss).abs() <= 1e-6 * a.loss.abs(),
                "tp={size} loss"
            );
            for ((n, ga), (_, gb)) in a.grads.iter().zip(&b.grads) {
                let scale = ga.data().iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                let diff = ga.max_abs_diff(gb).unwrap();
                assert!(diff <= 1e-5 * scale, "tp={size} rank {rank} {n}: {diff}");
            }
            // The hand-off is the rank's slice, [3, 8 / t, 16].
            assert_eq!(b.handoff * size, a.handoff, "tp={size} hand-off");
            assert!(
                b.stash[0] < a.stash[0] && b.stash[1] < a.stash[1],
                "tp={size} stash"
            );
        }
        // Replicated norms stay replicas: their summed gradients agree to the bit.
        for r in &sp[1..] {
            for ((n, a), (_, b)) in r.grads.iter().zip(&sp[0].grads) {
                if n.contains("ln") || n.contains("embed") || n.contains("head") {
                    assert_eq!(a, b, "tp={size} {n}");
                }
            }
        }
    }
}

#[test]
fn a_sequence_the_group_does_not_divide_is_refused() {
    let cfg = GptConfig::new(13, 6, 16, 4, 2);
    let mut st = GptStage::new(&cfg, 3, 0, 1, TpShard::new(0, 4).unwrap()).unwrap();
    let err = st
        .set_sequence_parallel(Some(TpShard::new(0, 4).unwrap()))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("sequence length 6 is not divisible by the tensor-parallel size 4"),
        "{err}"
    );
    // A group of one has nothing to split: off, not an error.
    let mut one = GptStage::whole(&cfg, 3).unwrap();
    one.set_sequence_parallel(Some(TpShard::SINGLE)).unwrap();
    assert_eq!(one.sequence_parallel(), None);
}
