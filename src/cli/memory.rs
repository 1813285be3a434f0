//! Model-shape flags of `simulate` and `search`: with them, the memory model predicts each
//! rank's memory by category, and a byte cap bounds the whole rank.

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Result};
use clap::{Args, ValueEnum};
use pipewright::schedule::memory::{
    predict, Accounting, AttentionKind, MemPrecision, MemoryBreakdown, MemoryConfig,
};
use pipewright::schedule::{RecomputePlan, Timetable};

use std::path::PathBuf;

use super::args::PrecisionArg;
use super::outputs::Input;
use super::shape::{parse_attention, read_hf_config, ShapeArgs};

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
    /// gpt_neox); --seq-len, if given, replaces the config's sequence length.
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

    /// The memory model's configuration for `pp` devices and `v` chunks each, if a shape is
    /// given; a shape given in part, or mesh flags without one, are refused by name.
    pub fn config(
        &self,
        pp: u32,
        v: u32,
        recompute: &RecomputePlan,
    ) -> Result<Option<MemoryConfig>> {
        let shape_flags = [
            ("--layers", self.layers.is_some()),
            ("--d-model", self.d_model.is_some()),
            ("--heads", self.heads.is_some()),
            ("--seq-len", self.seq_len.is_some()),
            ("--vocab", self.vocab.is_some()),
        ];
        let kinds = self.shape.given();
        let other_flags = [
            ("--microbatch-size", self.microbatch_size.is_some()),
            ("--tp", self.tp.is_some()),
            ("--dp", self.dp.is_some()),
            ("--zero", self.zero.is_some()),
            ("--sequence-parallel", self.sequence_parallel),
            ("--precision", self.precision.is_some()),
            ("--accounting", self.accounting.is_some()),
            ("--attention", self.attention.is_some()),
        ];
        let shape = match &self.hf_config {
            Some(path) => read_hf_config(path, self.seq_len)?.shape,
            None => {
                let missing: Vec<&str> = shape_flags.iter().filter(|f| !f.1).map(|f| f.0).collect();
                let given = shape_flags
                    .iter()
                    .chain(&other_flags)
                    .find(|f| f.1)
                    .map(|f| f.0)
                    .or(kinds.first().copied());
                match (given, missing.is_empty()) {
                    (None, _) => return Ok(None),
                    (Some(flag), false) => bail!(
                        "{flag} is for the memory model, which needs the model's shape: also give {} (or --hf-config)",
                        missing.join(", ")
                    ),
                    (Some(_), true) => {}
                }
                self.shape.shape(
                    self.layers.unwrap_or(0),
                    self.d_model.unwrap_or(0),
                    self.heads.unwrap_or(0),
                    self.seq_len.unwrap_or(0),
                    self.vocab.unwrap_or(0),
                )?
            }
        };
        Ok(Some(MemoryConfig {
            shape,
            precision: match self.precision {
                Some(PrecisionArg::Bf16) => MemPrecision::Bf16,
                _ => MemPrecision::F32,
            },
            accounting: match self.accounting {
                Some(AccountingArg::Megatron) => Accounting::Megatron,
                _ => Accounting::Pipewright,
            },
            pp,
            tp: self.tp.unwrap_or(1),
            dp: self.dp.unwrap_or(1),
            v,
            microbatch_size: self.microbatch_size.unwrap_or(4),
            sequence_parallel: self.sequence_parallel,
            zero: self.zero.unwrap_or(0),
            recompute: recompute.clone(),
            attention: self.attention.unwrap_or_default(),
        }))
    }

    /// Each device's predicted memory for `tt`, if a shape is given.
    pub fn predict(
        &self,
        tt: &Timetable,
        recompute: &RecomputePlan,
    ) -> Result<Option<Vec<MemoryBreakdown>>> {
        let p = tt.num_devices().max(1);
        let Some(cfg) = self.config(p, (tt.num_stages() / p).max(1), recompute)? else {
            return Ok(None);
        };
        cfg.check().map_err(|e| anyhow!("{e}"))?;
        super::budget::representable(&cfg, tt.microbatches)?;
        Ok(Some(predict(&cfg, tt).map_err(|e| anyhow!("{e}"))?))
    }
}

/// Bytes for people: EiB down to KiB with two decimals, or bytes.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        n if n >= 1 << 60 => format!("{:.2} EiB", b / (1u64 << 60) as f64),
        n if n >= 1 << 50 => format!("{:.2} PiB", b / (1u64 << 50) as f64),
        n if n >= 1 << 40 => format!("{:.2} TiB", b / (1u64 << 40) as f64),
        n if n >= 1 << 30 => format!("{:.2} GiB", b / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.2} MiB", b / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.2} KiB", b / 1024.0),
        n => format!("{n} B"),
    }
}

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
