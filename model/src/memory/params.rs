//! Parameters, gradients and optimizer state per rank: the model's weights cut into stages
//! (like `pipewright_kernels::gpt::partition`), split over TP, and AdamW's state sharded over
//! the data-parallel group under ZeRO-1 (contiguous shards of `ceil(n / d)` values per stage,
//! so the largest rank is counted).

use std::ops::Range;

use super::moe::{blocks_rank_parameters, state_bytes, SideParameters};
use super::{Accounting, MemPrecision, MemoryBreakdown, MemoryConfig, ModelShape};
use pipewright_schedule::timetable::Timetable;

/// The blocks (0-based indices) of stage `s` of `stages`, cut as [`stage_layers`] counts.
pub(super) fn stage_range(layers: u32, stages: u32, s: u32) -> Range<u32> {
    let start = (0..s).map(|k| stage_layers(layers, stages, k)).sum::<u32>();
    start..start + stage_layers(layers, stages, s)
}

/// Blocks of stage `s` of `stages`: an even cut, earlier stages taking the remainder.
pub(super) fn stage_layers(layers: u32, stages: u32, s: u32) -> u32 {
    let stages = stages.max(1);
    let (base, extra) = (layers / stages, layers % stages);
    base + u32::from(s < extra)
}

/// Parameters of stage `s` of `stages` (token embedding and learned position table on the
/// first stage, final norm and LM head on the last, its own or, tied, the embedding's copy
/// when the stages differ; blocks cut like `pipewright_kernels::gpt::partition`), before the
/// TP split. The pieces are [`ModelShape`]'s.
pub fn stage_parameters(shape: &ModelShape, stages: u32, s: u32) -> u64 {
    let layers = u64::from(stage_layers(shape.layers, stages, s));
    let first = if s == 0 {
        shape.embedding_parameters() + shape.position_parameters()
    } else {
        0
    };
    let last = if s + 1 == stages.max(1) {
        shape.norm_parameters() + shape.head_parameters(s != 0)
    } else {
        0
    };
    first + layers * shape.block_parameters(1) + last
}

/// Parameters of stage `s` on one TP rank. Blocks: QKV and the MLP's up projection split by
/// columns (biases too), the output projections by rows (full biases), norms replicated
/// ([`ModelShape::block_parameters`]). Pipewright replicates the embedding and the head;
/// Megatron splits the word embedding and the output layer by vocabulary (the position
/// table and the norms whole).
pub(super) fn rank_parameters(cfg: &MemoryConfig, s: u32) -> u64 {
    let p = rank_sides(cfg, s);
    p.dense + p.expert
}

/// Parameters of stage `s` on one rank, by the side whose data-parallel group reduces them:
/// a uniform shape's are all the dense side's; a mixture's or latent attention's blocks are
/// [`blocks_rank_parameters`]'s (experts split by `ep x etp`).
pub(super) fn rank_sides(cfg: &MemoryConfig, s: u32) -> SideParameters {
    let sh = &cfg.shape;
    let t = u64::from(cfg.tp.max(1));
    let stages = cfg.stages();
    let layers = u64::from(stage_layers(sh.layers, stages, s));
    let vocab_split = match cfg.accounting {
        Accounting::Megatron => t,
        Accounting::Pipewright => 1,
    };
    let first = if s == 0 {
        sh.embedding_parameters().div_ceil(vocab_split) + sh.position_parameters()
    } else {
        0
    };
    let last = if s + 1 == stages {
        sh.norm_parameters() + sh.head_parameters(s != 0).div_ceil(vocab_split)
    } else {
        0
    };
    let outer = first + last;
    if sh.is_uniform() {
        return SideParameters {
            dense: outer + layers * sh.block_parameters(t),
            expert: 0,
        };
    }
    let range = stage_range(sh.layers, stages, s);
    let e = &cfg.experts;
    // The reference GPT splits every expert over the TP group.
    let etp = match cfg.accounting {
        Accounting::Megatron => e.etp,
        Accounting::Pipewright => cfg.tp,
    };
    let blocks = blocks_rank_parameters(sh, range, cfg.tp, e.ep, etp);
    SideParameters {
        dense: outer + blocks.dense,
        expert: blocks.expert,
    }
}

/// Bytes per parameter of (weight, gradient, optimizer state). Pipewright stores f32 weights,
/// gradients and moments in every precision (its bf16 rounds values held in f32).
fn bytes_per_parameter(cfg: &MemoryConfig) -> (u64, u64, u64) {
    match (cfg.accounting, cfg.precision) {
        (Accounting::Megatron, MemPrecision::Bf16) => (2, 4, 12),
        _ => (4, 4, 8),
    }
}

/// Parameters, gradients and optimizer state of device `d`'s largest rank.
pub(super) fn device_state(cfg: &MemoryConfig, tt: &Timetable, device: u32) -> MemoryBreakdown {
    let bytes = bytes_per_parameter(cfg);
    let edp = cfg.experts.edp(cfg.tp, cfg.dp);
    let (mut parameters, mut gradients, mut optimizer_state) = (0u64, 0u64, 0u64);
    for s in (0..tt.num_stages()).filter(|&s| tt.device_of(s) == Some(device)) {
        // ZeRO-1 shards each side over its own group: the dense side over dp, the experts
        // over expert-DP (a uniform shape's experts are none).
        let (p, g, o) = state_bytes(rank_sides(cfg, s), cfg.dp, edp, cfg.zero, bytes);
        parameters += p;
        gradients += g;
        optimizer_state += o;
    }
    MemoryBreakdown {
        parameters,
        gradients,
        optimizer_state,
        ..MemoryBreakdown::default()
    }
}
