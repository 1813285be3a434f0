//! The reference GPT: stage equivalence, I/W split, microbatch accumulation,
//! gradient check of the whole model, training, and API errors.

use crate::common;

use common::check_params;
use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, Positions, StageOutput};
use pipewright_kernels::layers::{NoTp, Parameters, TpShard};
use pipewright_kernels::optim::{AdamW, AdamWConfig};
use pipewright_kernels::KernelError;

fn cfg() -> GptConfig {
    GptConfig::new(13, 8, 16, 4, 4)
}

fn data(batch: usize, seq: usize, vocab: u32) -> (Vec<u32>, Vec<u32>) {
    let tokens: Vec<u32> = (0..batch * seq)
        .map(|i| (i as u32 * 7 + 3) % vocab)
        .collect();
    let targets = tokens.iter().map(|t| (t * 5 + 1) % vocab).collect();
    (tokens, targets)
}

fn loss_of(out: StageOutput) -> f32 {
    match out {
        StageOutput::Loss(l) => l,
        StageOutput::Hidden(_) => panic!("expected a loss"),
    }
}

/// Forward through all stages, then backward in reverse; returns the loss
/// and the gradients flattened in stage order.
fn run_pipeline(stages: &mut [GptStage], mb: &Microbatch<'_>, split_iw: bool) -> (f32, Vec<f32>) {
    let (mut x, mut stashes, mut loss) = (None, Vec::new(), 0.0);
    for st in stages.iter() {
        let (out, stash) = st.forward(mb, x.take(), &mut NoTp).unwrap();
        stashes.push(stash);
        match out {
            StageOutput::Hidden(h) => x = Some(h),
            StageOutput::Loss(l) => loss = l,
        }
    }
    let mut g = None;
    for (st, stash) in stages.iter_mut().zip(stashes).rev() {
        g = if split_iw {
            let (dx, ws) = st.backward_input(stash, g.take(), &mut NoTp).unwrap();
            st.backward_weight(ws).unwrap();
            dx
        } else {
            st.backward(stash, g.take(), &mut NoTp).unwrap()
        };
    }
    assert!(g.is_none(), "the first stage returns no input gradient");
    (loss, stages.iter().flat_map(|s| s.flat_grads()).collect())
}

fn build(stages: usize) -> Vec<GptStage> {
    (0..stages)
        .map(|s| GptStage::new(&cfg(), 42, s, stages, TpShard::SINGLE).unwrap())
        .collect()
}

#[test]
fn one_two_and_four_stages_agree_exactly() {
    let (tokens, targets) = data(3, 8, 13);
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let (loss, grads) = run_pipeline(&mut build(1), &mb, false);
    assert!(
        loss.is_finite() && loss > 2.0,
        "near ln(13) at init: {loss}"
    );
    assert!(grads.iter().any(|g| *g != 0.0));
    let params: Vec<f32> = build(1)[0].flat_params();
    for n in [2, 4] {
        let mut st = build(n);
        let flat: Vec<f32> = st.iter().flat_map(|s| s.flat_params()).collect();
        assert_eq!(flat, params, "{n} stages hold the whole model's numbers");
        let (l, g) = run_pipeline(&mut st, &mb, n == 4);
        // Identical arithmetic in the identical order: bit-exact.
        assert_eq!(l, loss, "{n} stages");
        assert_eq!(g, grads, "{n} stages");
    }
}

#[test]
fn input_then_weight_backward_equals_full_backward() {
    let (tokens, targets) = data(2, 8, 13);
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let (_, full) = run_pipeline(&mut build(2), &mb, false);
    let (_, split) = run_pipeline(&mut build(2), &mb, true);
    assert_eq!(full, split);
    // W can also be deferred past other microbatches' work, as zero-bubble does.
    let mut st = build(1).remove(0);
    let (_, s1) = st.forward(&mb, None, &mut NoTp).unwrap();
    let (_, s2) = st.forward(&mb, None, &mut NoTp).unwrap();
    let (_, w1) = st.backward_input(s1, None, &mut NoTp).unwrap();
    let (_, w2) = st.backward_input(s2, None, &mut NoTp).unwrap();
    st.backward_weight(w2).unwrap();
    st.backward_weight(w1).unwrap();
    let twice: Vec<f32> = full.iter().map(|g| 2.0 * g).collect();
    let got = st.flat_grads();
    assert!(got
        .iter()
        .zip(&twice)
        .all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs())));
}

#[test]
fn scaled_microbatches_accumulate_to_the_whole_batch() {
    let (tokens, targets) = data(4, 8, 13);
    let whole = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let (loss, grads) = run_pipeline(&mut build(1), &whole, false);
    let mut st = build(2);
    let mut total = 0.0;
    for half in 0..2 {
        let r = half * 16..(half + 1) * 16;
        let mb = Microbatch {
            tokens: &tokens[r.clone()],
            targets: &targets[r],
            seq: 8,
            loss_scale: 0.5,
        };
        total += run_pipeline(&mut st, &mb, false).0;
    }
    let acc: Vec<f32> = st.iter().flat_map(|s| s.flat_grads()).collect();
    assert!((total - loss).abs() < 1e-5, "{total} vs {loss}");
    let max = acc
        .iter()
        .zip(&grads)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(max < 1e-6, "accumulated gradients differ by {max}");
}

/// Learned positions, and rotary ones (no position table: the queries and keys turn, with a
/// base small enough that every pair turns visibly over 4 positions).
#[test]
fn whole_model_gradient_check() {
    let learned = GptConfig::new(7, 4, 8, 2, 2);
    let rotary = GptConfig {
        positions: Positions::Rotary { theta: 10.0 },
        ..learned
    };
    let (tokens, targets) = data(2, 4, 7);
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 4,
        loss_scale: 1.0,
    };
    for (cfg, want) in [(learned, 80), (rotary, 76)] {
        let mut m = GptStage::whole(&cfg, 5).unwrap();
        // Larger weights than GPT-2's 0.02 so every path carries a testable signal.
        m.visit_mut(&mut |p| {
            if p.decay || p.name.contains("wpe") {
                p.value.scale(20.0);
            }
        });
        let (_, stash) = m.forward(&mb, None, &mut NoTp).unwrap();
        m.backward(stash, None, &mut NoTp).unwrap();
        let checked = check_params(&m, 4, |m| {
            loss_of(m.forward(&mb, None, &mut NoTp).unwrap().0) as f64
        });
        assert!(checked > want, "{cfg:?}: {checked}");
    }
}

#[test]
fn adamw_training_reduces_loss() {
    // Task: each sequence counts up by one from a random start; predict the next token.
    let cfg = GptConfig::new(16, 8, 32, 4, 2);
    let tokens: Vec<u32> = (0..8 * 8)
        .map(|i| ((i / 8) * 3 + i % 8) as u32 % 16)
        .collect();
    let targets: Vec<u32> = tokens.iter().map(|t| (t + 1) % 16).collect();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let mut m = GptStage::whole(&cfg, 1).unwrap();
    let mut opt = AdamW::new(
        m.num_params(),
        AdamWConfig {
            lr: 1e-2,
            ..Default::default()
        },
    );
    let mut losses = Vec::new();
    for _ in 0..40 {
        m.zero_grad();
        let (out, stash) = m.forward(&mb, None, &mut NoTp).unwrap();
        losses.push(loss_of(out));
        m.backward(stash, None, &mut NoTp).unwrap();
        opt.step(&mut m).unwrap();
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!((first - 16f32.ln()).abs() < 0.3, "initial loss {first}");
    assert!(last < 0.2 * first, "loss went {first} -> {last}");
}

#[test]
fn config_and_stage_errors_are_reported() {
    let c = cfg();
    assert!(
        GptStage::new(&c, 0, 0, 5, TpShard::SINGLE).is_err(),
        "more stages than layers"
    );
    assert!(
        GptStage::new(&c, 0, 2, 2, TpShard::SINGLE).is_err(),
        "no such stage"
    );
    assert!(GptStage::new(&GptConfig { n_heads: 5, ..c }, 0, 0, 1, TpShard::SINGLE).is_err());
    assert!(
        GptStage::new(&c, 0, 0, 1, TpShard::new(0, 8).unwrap()).is_err(),
        "tp > heads"
    );
    let st = build(2);
    let (tokens, targets) = data(1, 8, 13);
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    assert!(matches!(
        st[1].forward(&mb, None, &mut NoTp),
        Err(KernelError::Stage { stage: 1, .. })
    ));
    let (out, stash) = st[0].forward(&mb, None, &mut NoTp).unwrap();
    assert!(
        st[0].backward_input(stash, None, &mut NoTp).is_err(),
        "needs a gradient"
    );
    let StageOutput::Hidden(h) = out else {
        panic!()
    };
    let bad = pipewright_kernels::Tensor::zeros(&[1, 7, 16]);
    assert!(st[1].forward(&mb, Some(bad), &mut NoTp).is_err());
    let short = Microbatch {
        targets: &targets[..4],
        ..mb
    };
    assert!(st[1].forward(&short, Some(h.clone()), &mut NoTp).is_err());
    let oob: Vec<u32> = vec![13; 8];
    let bad_tokens = Microbatch { tokens: &oob, ..mb };
    assert!(matches!(
        st[0].forward(&bad_tokens, None, &mut NoTp),
        Err(KernelError::TokenOutOfRange { id: 13, vocab: 13 })
    ));
    let long = Microbatch {
        seq: 16,
        tokens: &[0; 16],
        targets: &[0; 16],
        ..mb
    };
    assert!(st[0].forward(&long, None, &mut NoTp).is_err());
}
