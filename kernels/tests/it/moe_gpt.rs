//! The reference GPT with mixtures of experts: any cut into stages holds and computes
//! exactly the whole model's numbers, the parameter count includes the experts, TP
//! threads equal one rank, it trains, and bad mixtures are refused.

use pipewright_kernels::gpt::{GptConfig, GptStage, Microbatch, MlpKind, MoeSpec, StageOutput};
use pipewright_kernels::layers::{NoTp, Parameters, TpShard};
use pipewright_kernels::optim::{AdamW, AdamWConfig};

/// `name` with a mixture's `experts.N.` or `shared.` removed: the dense MLP's name of the
/// same matrix, for tests that cut by name.
pub(crate) fn as_dense_name(name: &str) -> String {
    let mut parts: Vec<&str> = name.split('.').collect();
    if let Some(i) = parts.iter().position(|p| *p == "experts") {
        parts.drain(i..i + 2);
    } else if let Some(i) = parts.iter().position(|p| *p == "shared") {
        parts.remove(i);
    }
    parts.join(".")
}

/// 4 blocks: the first dense, then mixtures of 4 experts (top-2) with a shared expert.
pub(crate) fn cfg() -> GptConfig {
    let spec = MoeSpec {
        shared_d_ff: 8,
        dense_first: 1,
        ..MoeSpec::new(4, 2, 12)
    };
    GptConfig {
        moe: Some(spec),
        ..GptConfig::new(13, 8, 16, 4, 4)
    }
}

fn data(batch: usize, seq: usize) -> (Vec<u32>, Vec<u32>) {
    let tokens: Vec<u32> = (0..batch * seq).map(|i| (i as u32 * 7 + 3) % 13).collect();
    let targets = tokens.iter().map(|t| (t * 5 + 1) % 13).collect();
    (tokens, targets)
}

/// Forward through the stages, then I and W backward in reverse: the loss and gradients.
fn run(stages: &mut [GptStage], mb: &Microbatch<'_>) -> (f32, Vec<f32>) {
    let (mut x, mut stashes, mut loss) = (None, Vec::new(), f32::NAN);
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
        let (dx, ws) = st.backward_input(stash, g.take(), &mut NoTp).unwrap();
        st.backward_weight(ws).unwrap();
        g = dx;
    }
    (loss, stages.iter().flat_map(|s| s.flat_grads()).collect())
}

fn build(cfg: &GptConfig, stages: usize) -> Vec<GptStage> {
    (0..stages)
        .map(|s| GptStage::new(cfg, 42, s, stages, TpShard::SINGLE).unwrap())
        .collect()
}

#[test]
fn moe_blocks_are_where_the_spec_says() {
    let whole = GptStage::whole(&cfg(), 1).unwrap();
    let mut kinds = vec![false; 4];
    whole.visit(&mut |p| {
        if let Some(rest) = p.name.strip_suffix(".mlp.router.weight") {
            kinds[rest["blocks.".len()..].parse::<usize>().unwrap()] = true;
        }
    });
    assert_eq!(kinds, [false, true, true, true]);
    let every2 = MoeSpec {
        every: 2,
        ..cfg().moe.unwrap()
    };
    let on: Vec<usize> = (0..6).filter(|&l| every2.is_moe_layer(l)).collect();
    // After the dense block 0, the last of each run of two: the model crate's count.
    assert_eq!(on, [2, 4]);
}

#[test]
fn parameter_count_includes_router_experts_and_shared_expert() {
    let (c, dense) = (cfg(), GptConfig::new(13, 8, 16, 4, 4));
    assert_eq!(GptStage::whole(&c, 1).unwrap().num_params(), c.num_params());
    // Per mixture: router 16 x 4, 4 GeLU experts of width 12 and one of 8 (weights and
    // biases), in place of the dense MLP of width 64.
    let mlp = |f: i64| 16 * f + f + f * 16 + 16;
    let per_layer = 16 * 4 + 4 * mlp(12) + mlp(8) - mlp(64);
    assert_eq!(
        c.num_params() as i64,
        dense.num_params() as i64 + 3 * per_layer
    );
}

#[test]
fn one_two_and_four_stages_agree_exactly() {
    let (tokens, targets) = data(3, 8);
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let c = cfg();
    let (loss, grads) = run(&mut build(&c, 1), &mb);
    assert!(
        loss.is_finite() && loss > 2.0,
        "near ln(13) at init: {loss}"
    );
    // Every mixture's router gets a gradient (through the gates and the aux loss).
    let whole = {
        let mut st = build(&c, 1);
        run(&mut st, &mb);
        st.remove(0)
    };
    let mut routers = 0;
    whole.visit(&mut |p| {
        if p.name.ends_with("router.weight") {
            routers += 1;
            assert!(p.grad.data().iter().any(|g| *g != 0.0), "{}", p.name);
        }
    });
    assert_eq!(routers, 3);
    for n in [2, 4] {
        let (l, g) = run(&mut build(&c, n), &mb);
        assert_eq!(l, loss, "{n} stages");
        assert_eq!(g, grads, "{n} stages");
    }
}

#[test]
fn moe_gpt_on_tp_threads_matches_whole() {
    let gated = GptConfig {
        mlp: MlpKind::SwiGlu,
        d_ff: 24,
        ..cfg()
    };
    crate::tp::check_gpt_on_tp_threads(
        &GptConfig {
            n_layers: 2,
            ..cfg()
        },
        &[2],
    );
    crate::tp::check_gpt_on_tp_threads(
        &GptConfig {
            n_layers: 2,
            ..gated
        },
        &[2, 4],
    );
}

#[test]
fn moe_gpt_trains() {
    let c = GptConfig {
        moe: Some(MoeSpec::new(4, 2, 32)),
        ..GptConfig::new(16, 8, 32, 4, 2)
    };
    let tokens: Vec<u32> = (0..64).map(|i| ((i / 8) * 3 + i % 8) as u32 % 16).collect();
    let targets: Vec<u32> = tokens.iter().map(|t| (t + 1) % 16).collect();
    let mb = Microbatch {
        tokens: &tokens,
        targets: &targets,
        seq: 8,
        loss_scale: 1.0,
    };
    let mut m = GptStage::whole(&c, 1).unwrap();
    let adamw = AdamWConfig {
        lr: 1e-2,
        ..Default::default()
    };
    let mut opt = AdamW::new(m.num_params(), adamw);
    let mut losses = Vec::new();
    for _ in 0..40 {
        m.zero_grad();
        let (out, stash) = m.forward(&mb, None, &mut NoTp).unwrap();
        let StageOutput::Loss(l) = out else {
            panic!("the whole model returns a loss")
        };
        losses.push(l);
        m.backward(stash, None, &mut NoTp).unwrap();
        opt.step(&mut m).unwrap();
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.2 * first, "loss went {first} -> {last}");
}

#[test]
fn bad_mixtures_are_refused() {
    let with = |spec: MoeSpec| {
        GptStage::whole(
            &GptConfig {
                moe: Some(spec),
                ..cfg()
            },
            1,
        )
    };
    let base = cfg().moe.unwrap();
    let err = with(MoeSpec { top_k: 5, ..base }).unwrap_err().to_string();
    assert!(
        err.contains("moe: top_k 5 must be 1..=4 (the experts)"),
        "{err}"
    );
    let err = with(MoeSpec { experts: 0, ..base })
        .unwrap_err()
        .to_string();
    assert!(err.contains("moe: experts must be positive"), "{err}");
    let tp = TpShard::new(0, 4).unwrap();
    let odd = GptConfig {
        moe: Some(MoeSpec { d_ff: 6, ..base }),
        ..cfg()
    };
    let err = GptStage::new(&odd, 1, 0, 1, tp).unwrap_err().to_string();
    assert!(
        err.contains("tensor-parallel size 4 must divide d_ff (6)"),
        "{err}"
    );
}
