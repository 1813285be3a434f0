//! Expert parallelism on threads: two ranks, each with its own tokens and half the
//! experts, exchange rows by all-to-all and equal one rank holding every expert.

use crate::common;

use common::{grads, randn};
use pipewright_kernels::gpt::{GptStage, Microbatch, StageOutput};
use pipewright_kernels::layers::moe::ep::{ExpertExchange, NoEp};
use pipewright_kernels::layers::{Mlp, Moe, MoeConfig, NoTp, TpReduce, TpShard};
use pipewright_kernels::{Result, Tensor};
use std::sync::{Arc, Barrier, Mutex};

const D: usize = 4;
const E: usize = 4;

/// Messages in flight, `[destination][source]`, and the barrier between rounds.
type Mail = (Mutex<Vec<Vec<Option<Tensor>>>>, Barrier);

/// One rank's handle on an in-process all-to-all: a mailbox per (destination, source).
pub(crate) struct ThreadExchange {
    rank: usize,
    size: usize,
    mail: Arc<Mail>,
}

impl ThreadExchange {
    fn group(size: usize) -> Vec<Self> {
        let mail = Arc::new((Mutex::new(vec![vec![None; size]; size]), Barrier::new(size)));
        (0..size)
            .map(|rank| ThreadExchange {
                rank,
                size,
                mail: mail.clone(),
            })
            .collect()
    }
}

impl ExpertExchange for ThreadExchange {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_to_all(&mut self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let (boxes, barrier) = &*self.mail;
        for (dst, t) in send.into_iter().enumerate() {
            boxes.lock().unwrap()[dst][self.rank] = Some(t);
        }
        barrier.wait();
        let got = boxes.lock().unwrap()[self.rank]
            .iter_mut()
            .map(|m| m.take().expect("every rank sends to every rank"))
            .collect();
        // Nobody posts the next round before everyone has taken this one.
        barrier.wait();
        Ok(got)
    }
}

fn expert(name: &str) -> Mlp {
    let t = |n: &str, s: &[usize]| randn(s, &format!("{name}.{n}"));
    let (w1, b1, w2, b2) = (
        t("w1", &[D, 6]),
        t("b1", &[6]),
        t("w2", &[6, D]),
        t("b2", &[D]),
    );
    Mlp::from_full(name, &w1, &b1, &w2, &b2, TpShard::SINGLE).unwrap()
}

const CFG: MoeConfig = MoeConfig {
    top_k: 2,
    aux_coef: 0.05,
};

/// Rank `ep.rank`'s share of the mixture (all of it for a group of one).
fn layer(ep: TpShard) -> Moe {
    let local = E / ep.size;
    let experts = (ep.rank * local..(ep.rank + 1) * local)
        .map(|e| expert(&format!("moe.experts.{e}")))
        .collect();
    let shared = Some(expert("moe.shared"));
    let be = Arc::new(pipewright_kernels::Cpu);
    Moe::on_ep(
        &be,
        "moe",
        &randn(&[D, E], "router"),
        experts,
        shared,
        CFG,
        ep,
    )
    .unwrap()
}

type RankResult = (Tensor, Tensor, f32, Vec<(String, Tensor)>);

fn grad_of<'a>(g: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &g.iter().find(|(n, _)| n == name).expect(name).1
}

fn near(what: &str, a: &Tensor, b: &Tensor) {
    let diff = a.max_abs_diff(b).unwrap();
    assert!(diff <= 1e-5, "{what}: differs by {diff}");
}

#[test]
fn two_expert_parallel_ranks_equal_one_rank_with_every_expert() {
    let xs: Vec<Tensor> = (0..2)
        .map(|r| randn(&[2, 5, D], &format!("x{r}")))
        .collect();
    let rs: Vec<Tensor> = (0..2)
        .map(|r| randn(&[2, 5, D], &format!("r{r}")))
        .collect();
    // One rank: both token sets in turn, gradients accumulating.
    let mut whole = layer(TpShard::SINGLE);
    let mut want = Vec::new();
    for (x, r) in xs.iter().zip(&rs) {
        let (y, st) = whole.forward(x.clone(), &mut NoTp).unwrap();
        let aux = st.aux_loss();
        let (dx, ws) = whole.backward_input(st, r.clone(), &mut NoTp).unwrap();
        whole.backward_weight(ws).unwrap();
        want.push((y, dx, aux));
    }
    let whole_grads = grads(&whole);
    let got: Vec<RankResult> = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadExchange::group(2)
            .into_iter()
            .map(|mut ex| {
                let (x, r) = (xs[ex.rank].clone(), rs[ex.rank].clone());
                s.spawn(move || {
                    let mut m = layer(TpShard::new(ex.rank, 2).unwrap());
                    let (y, st) = m.forward_ep(x, &mut NoTp, &mut ex).unwrap();
                    let aux = st.aux_loss();
                    let (dx, ws) = m.backward_input_ep(st, r, &mut NoTp, &mut ex).unwrap();
                    m.backward_weight(ws).unwrap();
                    (y, dx, aux, grads(&m))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, ((y, dx, aux, g), (wy, wdx, waux))) in got.iter().zip(&want).enumerate() {
        near(&format!("rank {rank} output"), y, wy);
        near(&format!("rank {rank} input gradient"), dx, wdx);
        assert_eq!(aux, waux, "rank {rank} aux loss");
        // A rank's experts saw both ranks' rows: their gradients are the whole's.
        for e in 2 * rank..2 * rank + 2 {
            for p in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"] {
                let name = format!("moe.experts.{e}.{p}");
                near(&name, grad_of(g, &name), grad_of(&whole_grads, &name));
            }
        }
        assert!(!g
            .iter()
            .any(|(n, _)| n.contains(&format!("experts.{}", 2 - 2 * rank))));
    }
    // Replicated parts: each rank's gradient is its own tokens'; they sum to the whole's.
    for name in [
        "moe.router.weight",
        "moe.shared.fc1.weight",
        "moe.shared.fc2.bias",
    ] {
        let mut sum = grad_of(&got[0].3, name).clone();
        sum.add_assign(grad_of(&got[1].3, name)).unwrap();
        near(name, &sum, grad_of(&whole_grads, name));
    }
}

#[test]
fn a_group_other_than_the_layers_is_refused() {
    let m = layer(TpShard::new(1, 2).unwrap());
    let err = m
        .forward_ep(randn(&[3, D], "x"), &mut NoTp, &mut NoEp)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("an expert-parallel group at rank 0 of 1 for a layer built as rank 1 of 2"),
        "{err}"
    );
    let be = Arc::new(pipewright_kernels::Cpu);
    let three = TpShard::new(0, 3).unwrap();
    let experts = vec![expert("e0")];
    let err = Moe::on_ep(
        &be,
        "blocks.2.mlp",
        &randn(&[D, E], "w"),
        experts,
        None,
        CFG,
        three,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("blocks.2.mlp: expert-parallel size 3 must divide the 4 experts"),
        "{err}"
    );
}

/// A TP group of one whose mixtures run over an expert-parallel group.
struct EpOnly(ThreadExchange);

impl TpReduce for EpOnly {
    fn all_reduce_sum(&mut self, _t: &mut Tensor) -> Result<()> {
        Ok(())
    }
    fn expert_exchange(&mut self) -> Option<&mut dyn ExpertExchange> {
        Some(&mut self.0)
    }
}

fn tokens(rank: u32) -> (Vec<u32>, Vec<u32>) {
    let t: Vec<u32> = (0..24).map(|i| (i * 7 + 3 + rank * 5) % 13).collect();
    let targets = t.iter().map(|v| (v * 5 + 1) % 13).collect();
    (t, targets)
}

/// Forward through `stages`, then I and W backward: the loss.
fn step(stages: &mut [GptStage], data: &(Vec<u32>, Vec<u32>), tp: &mut dyn TpReduce) -> f32 {
    let mb = Microbatch {
        tokens: &data.0,
        targets: &data.1,
        seq: 8,
        loss_scale: 1.0,
    };
    let (mut x, mut stashes, mut loss) = (None, Vec::new(), f32::NAN);
    for st in stages.iter() {
        let (out, stash) = st.forward(&mb, x.take(), tp).unwrap();
        stashes.push(stash);
        match out {
            StageOutput::Hidden(h) => x = Some(h),
            StageOutput::Loss(l) => loss = l,
        }
    }
    let mut g = None;
    for (st, stash) in stages.iter_mut().zip(stashes).rev() {
        let (dx, ws) = st.backward_input(stash, g.take(), tp).unwrap();
        st.backward_weight(ws).unwrap();
        g = dx;
    }
    loss
}

/// Expert parallelism folded over data parallelism, at the model's level: two ranks, each
/// with its own tokens, a two-stage cut and half of every mixture's experts, against one
/// device that runs both ranks' tokens in turn.
#[test]
fn gpt_stages_over_two_expert_parallel_ranks_equal_one_device() {
    let cfg = crate::moe_gpt::cfg();
    let mut whole = vec![GptStage::whole(&cfg, 42).unwrap()];
    let want: Vec<f32> = (0..2)
        .map(|r| step(&mut whole, &tokens(r), &mut NoTp))
        .collect();
    let whole_grads = grads(&whole[0]);
    let got: Vec<(f32, Vec<(String, Tensor)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadExchange::group(2)
            .into_iter()
            .map(|ex| {
                let cfg = &cfg;
                s.spawn(move || {
                    let rank = ex.rank;
                    let mut stages: Vec<GptStage> = (0..2)
                        .map(|i| GptStage::new(cfg, 42, i, 2, TpShard::SINGLE).unwrap())
                        .collect();
                    for st in &mut stages {
                        st.shard_experts(TpShard::new(rank, 2).unwrap()).unwrap();
                    }
                    let loss = step(&mut stages, &tokens(rank as u32), &mut EpOnly(ex));
                    (loss, stages.iter().flat_map(grads).collect())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, ((loss, _), want)) in got.iter().zip(&want).enumerate() {
        assert!(
            (loss - want).abs() <= 1e-5 * want.abs(),
            "rank {rank}: {loss} vs {want}"
        );
    }
    let mut experts = 0;
    for (name, whole) in &whole_grads {
        let held: Vec<&Tensor> = got
            .iter()
            .filter_map(|(_, g)| g.iter().find(|(n, _)| n == name).map(|(_, t)| t))
            .collect();
        if name.contains(".experts.") {
            // Held by one rank, which saw both ranks' rows.
            assert_eq!(held.len(), 1, "{name}");
            near(name, held[0], whole);
            experts += 1;
        } else {
            let mut sum = held[0].clone();
            sum.add_assign(held[1]).unwrap();
            near(name, &sum, whole);
        }
    }
    assert_eq!(experts, 3 * 4 * 4, "3 mixtures of 4 experts of 4 tensors");
    // Without the exchange a sharded stage refuses to run rather than drop experts.
    let mut lone = GptStage::new(&cfg, 42, 0, 1, TpShard::SINGLE).unwrap();
    lone.shard_experts(TpShard::new(0, 2).unwrap()).unwrap();
    let data = tokens(0);
    let mb = Microbatch {
        tokens: &data.0,
        targets: &data.1,
        seq: 8,
        loss_scale: 1.0,
    };
    let err = lone.forward(&mb, None, &mut NoTp).unwrap_err().to_string();
    assert!(err.contains("for a layer built as rank 0 of 2"), "{err}");
}

/// An exchange of one rank that loses every row of its second message.
struct Lossy(usize);

impl ExpertExchange for Lossy {
    fn size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_to_all(&mut self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.0 += 1;
        if self.0 == 2 {
            return Ok(send.iter().map(|_| Tensor::zeros(&[0, D])).collect());
        }
        Ok(send)
    }
}

#[test]
fn an_exchange_that_loses_rows_is_refused_not_read_out_of_bounds() {
    let m = layer(TpShard::SINGLE);
    let err = m
        .forward_ep(randn(&[3, D], "x"), &mut NoTp, &mut Lossy(0))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("expert all-to-all: 1 messages do not hold the rows sent for 1 ranks"),
        "{err}"
    );
}
