//! Model-shape flags of `simulate` and `search`: with them, the memory model predicts each
//! rank's memory by category, and a byte cap bounds the whole rank. The flags fill the
//! schedule crate's `MemoryRequest`, which checks them (for Python too).

use std::fmt::Write as _;

use anyhow::Result;
use clap::{Args, ValueEnum};
use pipewright::schedule::memory::{
    Accounting, AttentionKind, MemoryBreakdown, MemoryConfig, MemoryRequest,
};
use pipewright::schedule::plan::Precision;
use pipewright::schedule::shape::ShapeRequest;
use pipewright::schedule::{RecomputePlan, Timetable};

use std::path::PathBuf;

use super::args::PrecisionArg;
use super::outputs::Input;
use super::shape::{hf_source, parse_attention, ShapeArgs};

/// Whose activations the memory model counts.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountingArg {
    /// Exactly what pipewright's reference GPT stashes (f32 storage in every precision).
    Pipewright,
    /// Korthikanti et al. 2022's per-layer bytes and Megatron's mixed precision (for
    /// planning Megatron-style runs: bf16 is 18 bytes a parameter, 6 + 12/d with ZeRO-1).
    Megatron,
}

/// The model and mesh the memory model needs: the five shape flags together, the rest
/// optional beside them.
#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Transformer blocks of a GPT-like model: with --d-model, --heads, --seq-len and
    /// --vocab (train's names), predict each rank's memory by category.
    #[arg(long, value_name = "N", help_heading = "Memory model")]
    layers: Option<u32>,
    /// Width of the residual stream.
    #[arg(long, value_name = "H", help_heading = "Memory model")]
    d_model: Option<u64>,
    /// Attention heads.
    #[arg(long, value_name = "A", help_heading = "Memory model")]
    heads: Option<u32>,
    /// Tokens per sequence.
    #[arg(long, value_name = "S", help_heading = "Memory model")]
    seq_len: Option<u64>,
    /// Vocabulary size.
    #[arg(long, value_name = "V", help_heading = "Memory model")]
    vocab: Option<u64>,
    #[command(flatten)]
    shape: ShapeArgs,
    /// A Hugging Face config.json instead of the shape flags (llama, mistral, qwen2, gpt2,
    /// gpt_neox, and the mixtures mixtral, qwen2_moe, qwen3_moe, deepseek_v3); --seq-len, if
    /// given, replaces the config's sequence length.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["layers", "d_model", "heads", "vocab", "ffn", "kv_heads", "mlp", "norm", "tied_embeddings", "positions", "rope_theta", "bias"],
        help_heading = "Memory model"
    )]
    hf_config: Option<PathBuf>,
    /// How the run computes attention: materialized (the CPU backend's; the scores are kept)
    /// or fused (FlashAttention, the CUDA backend's: one logsumexp per row) [default:
    /// materialized].
    #[arg(long, value_name = "KIND", value_parser = parse_attention, help_heading = "Memory model")]
    attention: Option<AttentionKind>,
    /// Sequences per microbatch [default: 4, train's].
    #[arg(long, value_name = "B", help_heading = "Memory model")]
    microbatch_size: Option<u64>,
    /// Tensor-parallel ranks per stage [default: 1].
    #[arg(long, help_heading = "Memory model")]
    tp: Option<u32>,
    /// Data-parallel replicas [default: 1].
    #[arg(long, help_heading = "Memory model")]
    dp: Option<u32>,
    /// ZeRO level, 0 or 1 [default: 0].
    #[arg(long, value_name = "LEVEL", help_heading = "Memory model")]
    zero: Option<u8>,
    /// Sequence parallelism with TP (megatron accounting).
    #[arg(long, help_heading = "Memory model")]
    sequence_parallel: bool,
    /// Number formats [default: f32]; bf16 is Megatron's mixed precision under the
    /// megatron accounting and changes no stored bytes under pipewright's.
    #[arg(long, value_enum, help_heading = "Memory model")]
    precision: Option<PrecisionArg>,
    /// Whose activations to count [default: pipewright].
    #[arg(long, value_enum, help_heading = "Memory model")]
    accounting: Option<AccountingArg>,
}

impl MemoryArgs {
    /// The file it reads, for [`Outputs::plan`](super::outputs::Outputs::plan): an output
    /// must not land on the model's config either.
    pub fn inputs(&self) -> impl Iterator<Item = Option<Input<'_>>> {
        std::iter::once(Input::new("--hf-config", self.hf_config.as_ref()))
    }

    /// The request as the library takes it (a config file read here).
    fn request(&self) -> Result<MemoryRequest> {
        Ok(MemoryRequest {
            shape: ShapeRequest {
                layers: self.layers,
                d_model: self.d_model,
                heads: self.heads,
                seq_len: self.seq_len,
                vocab: self.vocab,
                kinds: self.shape.kinds(),
                hf_config: hf_source(self.hf_config.as_ref())?,
            },
            attention: self.attention,
            microbatch_size: self.microbatch_size,
            tp: self.tp,
            dp: self.dp,
            zero: self.zero,
            sequence_parallel: self.sequence_parallel,
            precision: self.precision.map(|p| Precision::from(p).into()),
            accounting: self.accounting.map(|a| match a {
                AccountingArg::Megatron => Accounting::Megatron,
                AccountingArg::Pipewright => Accounting::Pipewright,
            }),
        })
    }

    /// Whether the memory model was asked for (a shape given in part, or mesh flags without
    /// one, are refused by name).
    pub fn given(&self) -> Result<bool> {
        Ok(self
            .request()?
            .config(1, 1, &RecomputePlan::default())?
            .is_some())
    }

    /// The memory model's checked configuration for `pp` devices and `v` chunks each, with
    /// `microbatches` in flight, if a shape is given.
    pub fn config(
        &self,
        pp: u32,
        v: u32,
        recompute: &RecomputePlan,
        microbatches: u32,
    ) -> Result<Option<MemoryConfig>> {
        Ok(self.request()?.checked(pp, v, recompute, microbatches)?)
    }

    /// Each device's predicted memory for `tt`, if a shape is given.
    pub fn predict(
        &self,
        tt: &Timetable,
        recompute: &RecomputePlan,
    ) -> Result<Option<Vec<MemoryBreakdown>>> {
        Ok(self.request()?.predict(tt, recompute)?)
    }
}

pub use pipewright::input::human;

/// The prediction as a table, one row per pipeline device.
pub fn memory_table(per_device: &[MemoryBreakdown]) -> String {
    let mut out = String::from(
        "predicted memory per rank (the largest rank of each device, at its highest total):\n",
    );
    let heads = [
        "device",
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
        "total",
    ];
    let _ = writeln!(
        out,
        "{:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        heads[0], heads[1], heads[2], heads[3], heads[4], heads[5], heads[6]
    );
    for (d, m) in per_device.iter().enumerate() {
        let _ = writeln!(
            out,
            "{d:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            human(m.parameters),
            human(m.gradients),
            human(m.optimizer_state),
            human(m.activations),
            human(m.buffers),
            human(m.total())
        );
    }
    out
}
