//! The published figures as tests: Korthikanti et al. 2022's per-layer formulas and their
//! pipeline identities, and Megatron's bytes per parameter with and without ZeRO-1.

use super::*;
use pipewright_schedule::generate;
use pipewright_schedule::spec::{ScheduleKind, ScheduleSpec};
use pipewright_schedule::timetable::Timetable;

/// GPT-3 175B as in Korthikanti et al., table 3: a = 96, h = 12288, L = 96, s = 2048.
fn gpt3() -> ModelShape {
    ModelShape::gpt(96, 12288, 96, 4 * 12288, 2048, 51200)
}

/// MT-NLG 530B: a = 128, h = 20480, L = 105, s = 2048.
fn mt_nlg() -> ModelShape {
    ModelShape::gpt(105, 20480, 128, 4 * 20480, 2048, 51200)
}

fn cfg(shape: ModelShape, tp: u32, sp: bool) -> MemoryConfig {
    MemoryConfig {
        tp,
        sequence_parallel: sp,
        ..MemoryConfig::new(shape, 1)
    }
}

/// The paper's per-layer formula, in f64 from its printed form.
fn paper(shape: &ModelShape, b: f64, t: f64, sp: bool, selective: bool) -> f64 {
    let (s, h, a) = (
        shape.seq_len as f64,
        shape.d_model as f64,
        f64::from(shape.heads),
    );
    let sbh = s * b * h;
    let core = if selective { 0.0 } else { 5.0 * a * s / h };
    if sp {
        sbh / t * (34.0 + core)
    } else {
        sbh * (10.0 + 24.0 / t + core / t)
    }
}

#[test]
fn per_layer_bytes_are_the_papers_formulas() {
    for shape in [gpt3(), mt_nlg()] {
        for (t, sp, sel) in [(1, false, false), (8, false, false), (8, true, false)]
            .into_iter()
            .chain([(8, false, true), (8, true, true), (1, false, true)])
        {
            let c = cfg(shape, t, sp);
            let policy = if sel {
                Recompute::Selective
            } else {
                Recompute::None
            };
            let want = paper(&shape, 1.0, f64::from(t), sp, sel);
            assert_eq!(layer_activation_bytes(&c, policy) as f64, want, "{t} {sp}");
        }
        // Without parallelism: sbh(34 + 5as/h), whichever of the forms is used.
        let sbh = (shape.seq_len * shape.d_model) as f64;
        let alone = sbh
            * (34.0 + 5.0 * f64::from(shape.heads) * shape.seq_len as f64 / shape.d_model as f64);
        assert_eq!(
            layer_activation_bytes(&cfg(shape, 1, false), Recompute::None) as f64,
            alone
        );
        assert_eq!(
            layer_activation_bytes(&cfg(shape, 1, true), Recompute::None) as f64,
            alone
        );
        // Full recomputation keeps the layer input: 2sbh, and 2sbh/t with SP.
        assert_eq!(
            layer_activation_bytes(&cfg(shape, 8, false), Recompute::Full) as f64,
            2.0 * sbh
        );
        assert_eq!(
            layer_activation_bytes(&cfg(shape, 8, true), Recompute::Full) as f64,
            2.0 * sbh / 8.0
        );
    }
}

#[test]
fn selective_saves_the_papers_seventy_and_sixty_five_percent() {
    // Section 5: 5as/h is 80 for GPT-3 and 64 for MT-NLG, so selective recomputation with
    // SP cuts activations by 70% and 65%.
    for (shape, term, saving) in [(gpt3(), 80.0, 0.70), (mt_nlg(), 64.0, 0.65)] {
        let c = cfg(shape, 8, true);
        let all = layer_activation_bytes(&c, Recompute::None) as f64;
        let sel = layer_activation_bytes(&c, Recompute::Selective) as f64;
        assert_eq!(all / sel, (34.0 + term) / 34.0);
        assert!(
            ((1.0 - sel / all) - saving).abs() < 0.01,
            "{}",
            1.0 - sel / all
        );
    }
}

fn pipeline(kind: ScheduleKind, p: u32, v: u32, m: u32) -> (MemoryConfig, Timetable) {
    let shape = ModelShape {
        layers: 48,
        ..gpt3()
    };
    let c = MemoryConfig {
        v,
        ..MemoryConfig::new(shape, p)
    };
    (
        c,
        generate(&ScheduleSpec::new(kind, p, v, m, None).unwrap()),
    )
}

#[test]
fn one_f1b_holds_l_layers_on_the_first_device_and_the_output_layer_on_the_last() {
    // Section 4.2.3: the first stage holds p microbatches of L/p layers each, so the
    // pipeline's activation memory is L layers' worth whatever p; each microbatch also
    // keeps the embedding's dropout mask (sbh). The last device holds one microbatch and
    // the output layer's 4sbh + 4sbV (f32 logits).
    for p in [2, 4, 8] {
        let (c, tt) = pipeline(ScheduleKind::OneFOneB, p, 1, 16);
        let got = predict(&c, &tt).unwrap();
        let layer = layer_activation_bytes(&c, Recompute::None);
        let sh = c.shape;
        let sbh = sh.seq_len * sh.d_model;
        assert_eq!(
            got[0].activations,
            48 * layer + u64::from(p) * sbh,
            "p = {p}"
        );
        let last = 48 / u64::from(p) * layer + 4 * sbh + 4 * sh.seq_len * sh.vocab;
        assert_eq!(got[p as usize - 1].activations, last, "p = {p}");
    }
}

#[test]
fn interleaving_holds_the_papers_one_plus_p_minus_one_over_pv_layers() {
    // Section 4.2.3: Megatron's interleaved schedule keeps L(1 + (p-1)/(pv)) layers' worth
    // on the first device.
    for (p, v) in [(2, 2), (4, 2), (4, 4)] {
        let (_, tt) = pipeline(ScheduleKind::Interleaved1F1B, p, v, 4 * p);
        let chunk = 48.0 / f64::from(p * v);
        let stages = vec![StageBytes::plain(chunk, chunk); (p * v) as usize];
        let want = 48.0 * (1.0 + f64::from(p - 1) / f64::from(p * v));
        assert!(
            (peak_walk(&tt, &stages)[0] - want).abs() < 1e-9,
            "p {p} v {v}"
        );
    }
}

#[test]
fn bytes_per_parameter_are_18_and_6_plus_12_over_d_in_bf16_and_16_and_8_plus_8_over_d_in_f32() {
    // A model whose every stage's parameter count divides by 8, so shards are exact.
    let shape = ModelShape::gpt(4, 64, 4, 256, 16, 64);
    let (c, tt) = {
        let c = MemoryConfig::new(shape, 2);
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
        (c, tt)
    };
    for d in 0..2u32 {
        let n = stage_parameters(&shape, 2, d);
        assert_eq!(n % 8, 0);
        let per = |precision, zero, dp| {
            let c = MemoryConfig {
                precision,
                zero,
                dp,
                ..c.clone()
            };
            let m = predict(&c, &tt).unwrap()[d as usize];
            let state = m.parameters + m.gradients + m.optimizer_state;
            state as f64 / n as f64
        };
        assert_eq!(per(MemPrecision::Bf16, 0, 8), 18.0);
        assert_eq!(per(MemPrecision::F32, 0, 8), 16.0);
        for dp in [1u32, 2, 4, 8] {
            let dpf = f64::from(dp);
            assert_eq!(per(MemPrecision::Bf16, 1, dp), 6.0 + 12.0 / dpf);
            assert_eq!(per(MemPrecision::F32, 1, dp), 8.0 + 8.0 / dpf);
        }
    }
    // The reference GPT's own count, embedding and head included.
    let whole: u64 = (0..2).map(|s| stage_parameters(&shape, 2, s)).sum();
    let (d, f, v, s) = (64u64, 256u64, 64u64, 16u64);
    let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
    assert_eq!(whole, v * d + s * d + 4 * block + 2 * d + d * v + v);
}

#[test]
fn zero_shards_round_up_to_the_largest_rank() {
    let shape = ModelShape::gpt(2, 8, 2, 32, 4, 8);
    let c = MemoryConfig {
        zero: 1,
        dp: 3,
        ..MemoryConfig::new(shape, 1)
    };
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 2, None).unwrap());
    let n = stage_parameters(&shape, 1, 0);
    assert_ne!(n % 3, 0);
    assert_eq!(
        predict(&c, &tt).unwrap()[0].optimizer_state,
        8 * n.div_ceil(3)
    );
}

#[test]
fn bad_configurations_are_refused_in_one_line_naming_the_size() {
    let (c, tt) = pipeline(ScheduleKind::OneFOneB, 2, 1, 4);
    let e = |c: MemoryConfig| predict(&c, &tt).unwrap_err().to_string();
    assert_eq!(
        e(MemoryConfig { tp: 7, ..c.clone() }),
        "memory model: tp (7) must divide heads (96)"
    );
    assert_eq!(
        e(MemoryConfig {
            microbatch_size: 0,
            ..c.clone()
        }),
        "memory model: microbatch_size must be positive"
    );
    assert!(e(MemoryConfig {
        zero: 2,
        ..c.clone()
    })
    .contains("ZeRO-2"));
    assert!(e(MemoryConfig { pp: 4, ..c.clone() }).contains("timetable has 2 devices"));
    let sp = MemoryConfig {
        sequence_parallel: true,
        accounting: Accounting::Pipewright,
        tp: 3,
        shape: ModelShape {
            seq_len: 1000,
            ..c.shape
        },
        ..c.clone()
    };
    assert_eq!(e(sp), "memory model: tp (3) must divide seq_len (1000)");
    let shallow = ModelShape {
        layers: 1,
        ..c.shape
    };
    assert!(e(MemoryConfig {
        shape: shallow,
        ..c
    })
    .contains("need at least 2 layers"));
}

#[test]
fn a_stage_with_r_actions_and_no_policy_recomputes_fully_as_the_runtime_does() {
    let (c, tt) = pipeline(ScheduleKind::OneFOneB, 2, 1, 4);
    let with_r = pipewright_schedule::recompute::insert(&tt, &"full".parse().unwrap());
    let full = MemoryConfig {
        recompute: "full".parse().unwrap(),
        ..c.clone()
    };
    assert_eq!(predict(&c, &with_r), predict(&full, &with_r));
    assert!(
        predict(&c, &with_r).unwrap()[0].activations < predict(&c, &tt).unwrap()[0].activations
    );
}

#[test]
fn megatron_recomputation_regrows_one_layer_at_a_time() {
    // 1F1B, p = 2, 48 layers: device 0 holds 2 microbatches of 24 layers, each keeping only
    // the layer inputs under full recomputation (2sbh) and its embedding mask (sbh); the
    // backward rebuilds one layer at a time.
    let (c, tt) = pipeline(ScheduleKind::OneFOneB, 2, 1, 4);
    let full = MemoryConfig {
        recompute: "full".parse().unwrap(),
        ..c
    };
    let sbh = full.shape.seq_len * full.shape.d_model;
    let whole = layer_activation_bytes(&full, Recompute::None);
    let got = predict(&full, &tt).unwrap()[0].activations;
    assert_eq!(got, 2 * (24 * 2 * sbh + sbh) + (whole - 2 * sbh));
}

/// BENCHMARKS.md's sequence-parallel GPT (4 layers, d 512, 8 heads, seq 256, vocab 4096,
/// b = 2) at pp = 2 x tp = 2 under 1F1B with 4 microbatches, pipewright accounting.
fn sp_gpt(sp: bool) -> Vec<DevicePrediction> {
    let shape = ModelShape::gpt(4, 512, 8, 2048, 256, 4096);
    let c = MemoryConfig {
        tp: 2,
        microbatch_size: 2,
        sequence_parallel: sp,
        ..MemoryConfig::new(shape, 2).with_accounting(Accounting::Pipewright)
    };
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    predict_detail(&c, &tt).unwrap()
}

#[test]
fn sequence_parallel_stashes_and_hand_offs_are_the_measured_bytes() {
    // Measured in BENCHMARKS.md ("Sequence parallelism"): stage 0 holds 2 microbatches of
    // 20,977,664 (SP) or 25,176,064 (TP) bytes, stage 1 one of 31,465,472 or 35,663,872;
    // a hand-off is 524,288 or 1,048,576 bytes.
    for (sp, s0, s1, handoff) in [
        (true, 20_977_664u64, 31_465_472u64, 524_288u64),
        (false, 25_176_064, 35_663_872, 1_048_576),
    ] {
        let p = sp_gpt(sp);
        assert_eq!(
            (p[0].max.activations, p[1].max.activations),
            (2 * s0, s1),
            "sp {sp}"
        );
        assert_eq!((p[0].max.buffers, p[1].max.buffers), (handoff, handoff));
        // Device 0 peaks once its second forward's output waits for its send.
        assert_eq!(
            (p[0].peak.activations, p[0].peak.buffers),
            (2 * s0, handoff)
        );
    }
}

#[test]
fn data_parallel_reductions_hold_the_flat_gradients_and_zero_1_its_shard_too() {
    // One stage, one microbatch: the stash is freed by the backward, then the flat
    // gradients (4 bytes a parameter) are held until reduced; ZeRO-1 adds the rank's shard.
    let shape = ModelShape::gpt(2, 16, 2, 64, 8, 16);
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 1, None).unwrap());
    let n = stage_parameters(&shape, 1, 0);
    for (zero, want) in [(0u8, 4 * n), (1, 4 * n + 4 * n.div_ceil(3))] {
        let c = MemoryConfig {
            dp: 3,
            zero,
            ..MemoryConfig::new(shape, 1).with_accounting(Accounting::Pipewright)
        };
        let p = predict_detail(&c, &tt).unwrap();
        assert_eq!(p[0].max.buffers, want, "zero {zero}");
        let once = predict_detail(&MemoryConfig { dp: 1, ..c }, &tt).unwrap();
        assert_eq!(once[0].max.buffers, 0);
        assert!(p[0].max.activations > 0 && p[0].max.activations == once[0].max.activations);
    }
}

#[test]
fn the_pipewright_accounting_takes_the_reference_gpt_s_kinds_and_refuses_tied_embeddings() {
    use crate::shape::{BiasKind, MlpKind, NormKind, PositionKind};
    let (c, tt) = pipeline(ScheduleKind::OneFOneB, 2, 1, 4);
    let pw = |shape: ModelShape| MemoryConfig {
        shape,
        accounting: Accounting::Pipewright,
        ..c.clone()
    };
    let llama = ModelShape {
        kv_heads: 8,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        bias: BiasKind::None,
        ..c.shape
    };
    // Fewer key/value heads and a gated MLP of the same width: the QKV's and MLP's stashes
    // change, nothing else.
    let (gpt, ours) = (
        predict(&pw(c.shape), &tt).unwrap(),
        predict(&pw(llama), &tt).unwrap(),
    );
    assert_ne!(gpt[0].activations, ours[0].activations);
    // Rotary positions: the reference keeps the turned queries and keys in place of the
    // projection's output, so every stash is the learned table's, to the byte; only the
    // first stage's parameters lose the table.
    let rotary = ModelShape {
        positions: PositionKind::Rotary,
        ..llama
    };
    let turned = predict(&pw(rotary), &tt).unwrap();
    for (a, b) in turned.iter().zip(&ours) {
        assert_eq!(a.activations, b.activations);
    }
    let table = 4 * llama.seq_len * llama.d_model;
    assert_eq!(turned[0].parameters + table, ours[0].parameters);
    assert_eq!(turned[1].parameters, ours[1].parameters);
    let tied = ModelShape {
        tied_embeddings: true,
        ..llama
    };
    let e = predict(&pw(tied), &tt).unwrap_err().to_string();
    assert!(e.contains("no tied embeddings"), "{e}");
}

/// The reference GPT's MoE block, term by term (`N = 16` rows of width 16, 4 experts of width
/// 16, top-2, a GeLU shared expert of width 8, f32): attention's part `T[3Nd + N(q + d)] +
/// R[2N + b a s²]` = 4 (1792 + 544) = 9344; the mixture's input `T[Nd]` 256, the routing
/// `R[NE + 3Nk]` 64 + 96, the returned copies `R[Nkd]` 512, the layout `R[4Nk + 4E]` 128 +
/// 16, the copies' stashes `T[Nk(d + 2 f_e)]` 1536 and the shared expert's `T[N(d + 2 f_s)]`
/// 512: 4 x 3120 = 12480. The dense block before it keeps the MLP's `T[Nd + 2 N ffn]` 2304.
#[test]
fn a_mixture_s_block_keeps_its_routing_copies_and_experts_stashes() {
    use crate::shape::{BiasKind, MoeShape};
    let moe = MoeShape {
        route_groups: None,
        experts: 4,
        top_k: 2,
        expert_ffn: 16,
        shared_experts: 1,
        shared_ffn: 8,
        shared_gate: false,
        router_bias: false,
        dense_layers: 1,
        every: 1,
    };
    let shape = ModelShape {
        bias: BiasKind::None,
        moe: Some(moe),
        ..ModelShape::gpt(4, 16, 4, 64, 8, 32)
    };
    let cfg = MemoryConfig {
        microbatch_size: 2,
        ..MemoryConfig::new(shape, 2).with_accounting(Accounting::Pipewright)
    };
    assert_eq!(layer_activation_bytes(&cfg, Recompute::None), 9344 + 12480);
    let dense = MemoryConfig {
        shape: ModelShape { moe: None, ..shape },
        ..cfg.clone()
    };
    assert_eq!(
        layer_activation_bytes(&dense, Recompute::None),
        9344 + 4 * 2304
    );
    // The last stage (two MoE blocks and the head, `T[2Nd] + R[N(2 + V)]`) under 1F1B.
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let last = predict(&cfg, &tt).unwrap()[1];
    assert_eq!(last.activations, 2 * (9344 + 12480) + 4 * (512 + 16 * 34));
}
