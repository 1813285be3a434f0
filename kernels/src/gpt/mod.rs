//! The reference GPT, built whole or as one stage of a pipeline, optionally
//! as one tensor-parallel rank of that stage.
//!
//! A stage holds a contiguous range of blocks; the first stage also holds the
//! embedding, the last the final norm, LM head and loss. The per-stage API is
//! shaped for a pipeline runtime that keeps per-microbatch state itself:
//! [`GptStage::forward`] returns a [`Stash`], [`GptStage::backward_input`]
//! consumes it and returns a [`WeightStash`], [`GptStage::backward_weight`]
//! consumes that and accumulates gradients. All stashes are `Send`.
//!
//! A stage runs on any [`Backend`]: `GptStage` (the default, [`Cpu`]) on
//! host tensors, `GptStage::<B>::on` on a device, where its weights,
//! activations, gradients and stashes stay; see [`crate::params`] for its
//! flat gradients and optimizer step there.

mod build;
mod config;
mod moe;
mod moe_spec;

pub use crate::layers::{MlpKind, MlpKindExt, NormKind};
pub use config::{partition, BiasKind, GptConfig, Positions};
pub use moe_spec::MoeSpec;

use crate::backend::{Backend, Shaped};

use crate::cpu::Cpu;
use crate::error::{shape_err, KernelError, Result};
use crate::footprint::Footprint;
use crate::layers::seq;
use crate::layers::{
    Block, BlockStash, BlockWeightStash, Embedding, HeadStash, HeadWeightStash, LmHead, Parameters,
    TpReduce, TpShard,
};
use crate::tensor::Tensor;
use std::ops::Range;
use std::sync::Arc;

/// The data of one microbatch, as every stage sees it. The first stage reads
/// `tokens`, the last reads `targets`; middle stages read neither.
#[derive(Clone, Copy, Debug)]
pub struct Microbatch<'a> {
    /// Input ids, `batch * seq` of them, row-major.
    pub tokens: &'a [u32],
    /// Target ids, same layout as `tokens`.
    pub targets: &'a [u32],
    /// Tokens per sequence (at most the config's `seq_len`).
    pub seq: usize,
    /// Multiplies the mean loss and its gradient: `1 / m` for `m` equal
    /// microbatches makes their summed losses and gradients equal those of
    /// the whole batch.
    pub loss_scale: f32,
}

/// What a stage's forward produces; `T` is the backend's tensor type.
#[derive(Clone, Debug)]
pub enum StageOutput<T = Tensor> {
    /// Activations `[batch, seq, d_model]` for the next stage.
    Hidden(T),
    /// The scaled loss (last stage).
    Loss(f32),
}

/// Token ids of a microbatch and its sequence length.
type Ids = (Vec<u32>, usize);

/// What a stage's forward keeps of a microbatch until its input backward:
/// the recomputation policies of Korthikanti et al. (2022).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Keep {
    /// Everything the backward needs.
    #[default]
    All,
    /// Everything but the attention probabilities, which
    /// [`GptStage::recompute`] rebuilds from the kept `qkv` (selective).
    NoAttentionCore,
    /// Only the stage's input (token ids on the first stage); the forward
    /// is run again by [`GptStage::recompute`] (full).
    Input,
    /// The stage's input and the stashes of all but its first `n` blocks,
    /// which [`GptStage::recompute`] runs again (Megatron's block method).
    FirstBlocksFrom(usize),
}

/// Per-microbatch state from forward to input backward.
#[derive(Debug)]
pub struct Stash<B: Backend = Cpu> {
    ids: Option<Ids>,
    blocks: Vec<BlockStash<B>>,
    head: Option<HeadStash<B>>,
    /// A copy of the stage's input activations, kept under [`Keep::Input`] and
    /// [`Keep::FirstBlocksFrom`] only.
    input: Option<B::Kept>,
    keep: Keep,
}

impl<B: Backend> Stash<B> {
    /// What this stash keeps: [`Keep::All`] once recomputed.
    pub fn keep(&self) -> Keep {
        self.keep
    }
}

impl<B: Backend> Footprint for Stash<B> {
    fn bytes(&self) -> usize {
        let ids = self.ids.as_ref().map_or(0, |(ids, _)| ids.bytes());
        ids + self.blocks.bytes() + self.head.bytes() + self.input.bytes()
    }
}

impl<B: Backend> Footprint for WeightStash<B> {
    fn bytes(&self) -> usize {
        let embed = self
            .embed
            .as_ref()
            .map_or(0, |(ids, _, dy)| ids.bytes() + dy.bytes());
        embed + self.blocks.bytes() + self.head.bytes()
    }
}

/// Per-microbatch state from input backward to weight backward.
#[derive(Debug)]
pub struct WeightStash<B: Backend = Cpu> {
    embed: Option<(Vec<u32>, usize, B::Kept)>,
    blocks: Vec<BlockWeightStash<B>>,
    head: Option<HeadWeightStash<B>>,
}

/// One pipeline stage (and one TP rank) of the reference GPT, on backend
/// `B` (the host by default).
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, embed, blocks, head)]
pub struct GptStage<B: Backend = Cpu> {
    cfg: GptConfig,
    index: usize,
    layers: Range<usize>,
    embed: Option<Embedding<B>>,
    blocks: Vec<Block<B>>,
    head: Option<LmHead<B>>,
    be: Arc<B>,
    /// This rank's place in its TP group when sequence parallelism is on.
    sp: Option<TpShard>,
}

crate::layers::clone_if_tensors_clone!(GptStage {
    cfg,
    index,
    layers,
    embed,
    blocks,
    head,
    be,
    sp
});

/// Rows of the matrix view of `x` (all leading dimensions folded).
fn rows<S: Shaped>(x: &S) -> usize {
    let cols = x.shape().last().copied().unwrap_or(1);
    x.numel().checked_div(cols).unwrap_or(0)
}

impl<B: Backend> GptStage<B> {
    /// Turns sequence parallelism on (`Some(shard)`, this stage's TP rank)
    /// or off (`None`); a group of one has nothing to split, so `tp = 1` is
    /// off. Under it the blocks keep the residual stream, the norms and their
    /// stashes on this rank's `seq / t` slice, the stage's input and output
    /// activations (and gradients) are slices, the first stage slices the
    /// embedding and the last gathers the stream before its head. Errors
    /// unless `t` divides the config's sequence length.
    pub fn set_sequence_parallel(&mut self, sp: Option<TpShard>) -> Result<()> {
        let sp = sp.filter(|t| t.size > 1);
        if let Some(t) = sp {
            seq::slice_len(self.cfg.seq_len, t)?;
        }
        self.sp = sp;
        Ok(())
    }

    /// The TP shard sequence parallelism splits over, if it is on.
    pub fn sequence_parallel(&self) -> Option<TpShard> {
        self.sp
    }

    /// Sums the norms' weight gradients over the TP group (one all-reduce of
    /// them packed flat): under sequence parallelism each rank's are those of
    /// its slice of the tokens, so without this the replicas of a norm would
    /// drift apart. Call once per step, after the last backward and before
    /// the optimizer (and the data-parallel reduction); a no-op without
    /// sequence parallelism.
    pub fn reduce_sequence_parallel_grads(
        &mut self,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<()> {
        if self.sp.is_none() || self.blocks.is_empty() {
            return Ok(());
        }
        let be = self.be.clone();
        let mut numel = 0;
        for b in &mut self.blocks {
            b.visit_norm_params_mut(&mut |p| numel += p.grad.numel());
        }
        let mut flat = be.zeros(&[numel])?;
        // The visitor cannot return errors: the first one is kept and returned.
        let mut pack = |unpack: bool, flat: &mut B::Storage| -> Result<()> {
            let (mut off, mut res) = (0, Ok(()));
            for b in &mut self.blocks {
                b.visit_norm_params_mut(&mut |p| {
                    if res.is_ok() {
                        res = if unpack {
                            be.copy_from_offset(flat, off, &mut p.grad)
                        } else {
                            be.copy_to_offset(&p.grad, flat, off)
                        };
                    }
                    off += p.grad.numel();
                });
            }
            res
        };
        pack(false, &mut flat)?;
        tp.all_reduce_sum(&mut flat)?;
        pack(true, &mut flat)
    }

    /// The backend this stage runs on.
    pub fn backend(&self) -> &Arc<B> {
        &self.be
    }

    /// The model's config.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// The blocks this stage holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Whether this stage embeds tokens.
    pub fn is_first(&self) -> bool {
        self.embed.is_some()
    }

    /// Whether this stage computes the loss.
    pub fn is_last(&self) -> bool {
        self.head.is_some()
    }

    fn err(&self, detail: impl Into<String>) -> KernelError {
        KernelError::Stage {
            stage: self.index,
            detail: detail.into(),
        }
    }

    /// Forward of one microbatch. The first stage takes `input = None` and
    /// embeds `mb.tokens`; other stages take the previous stage's
    /// activations. The last stage returns [`StageOutput::Loss`].
    pub fn forward(
        &self,
        mb: &Microbatch<'_>,
        input: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(StageOutput<B::Storage>, Stash<B>)> {
        self.forward_keeping(mb, input, tp, Keep::All)
    }

    /// [`GptStage::forward`] keeping only what `keep` says; the output is
    /// the same. Each block's dropped state is freed as soon as the block is
    /// done, so the forward itself never holds more than one block's worth.
    pub fn forward_keeping(
        &self,
        mb: &Microbatch<'_>,
        input: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
        keep: Keep,
    ) -> Result<(StageOutput<B::Storage>, Stash<B>)> {
        let kept_input = match (&input, keep) {
            (Some(x), Keep::Input | Keep::FirstBlocksFrom(_)) => {
                Some(self.be.keep(self.be.copy(x)?)?)
            }
            _ => None,
        };
        let (mut x, ids) = self.residual_input(mb, input)?;
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let (y, mut s) = b.forward_seq(x, tp, self.sp)?;
            match keep {
                Keep::All => blocks.push(s),
                Keep::NoAttentionCore => {
                    s.drop_attention_core();
                    blocks.push(s);
                }
                Keep::FirstBlocksFrom(n) if i >= n => blocks.push(s),
                Keep::Input | Keep::FirstBlocksFrom(_) => {}
            }
            x = y;
        }
        let Some(head) = &self.head else {
            let stash = Stash {
                ids,
                blocks,
                head: None,
                input: kept_input,
                keep,
            };
            return Ok((StageOutput::Hidden(x), stash));
        };
        if let Some(t) = self.sp {
            // The head is replicated: it reads the whole stream.
            x = seq::gather(&*self.be, tp, &x, t)?;
        }
        if mb.targets.len() != rows(&x) {
            return Err(self.err(format!(
                "{} targets for {} positions",
                mb.targets.len(),
                rows(&x)
            )));
        }
        let (loss, hs) = head.forward(&x, mb.targets, mb.loss_scale)?;
        let stash = Stash {
            ids,
            blocks,
            head: (keep != Keep::Input).then_some(hs),
            input: kept_input,
            keep,
        };
        Ok((StageOutput::Loss(loss), stash))
    }

    /// Rebuilds everything a [`GptStage::forward_keeping`] stash dropped, so
    /// that the input backward can run: the attention probabilities from the
    /// kept `qkv` (selective), or the whole forward from the kept input (full;
    /// `mb` must be the microbatch's own data, and with `tp > 1` every TP rank
    /// recomputes together, since the forward all-reduces). The computation
    /// is the forward's own, so the rebuilt stash holds the same bits.
    pub fn recompute(
        &self,
        mb: &Microbatch<'_>,
        mut stash: Stash<B>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<Stash<B>> {
        match stash.keep {
            Keep::All => Ok(stash),
            Keep::NoAttentionCore => {
                if stash.blocks.len() != self.blocks.len() {
                    return Err(self.err("stash from a different stage"));
                }
                for (b, s) in self.blocks.iter().zip(&mut stash.blocks) {
                    b.recompute_attention_core(s)?;
                }
                stash.keep = Keep::All;
                Ok(stash)
            }
            Keep::Input => {
                let input = self.restore_input(stash.input)?;
                Ok(self.forward_keeping(mb, input, tp, Keep::All)?.1)
            }
            Keep::FirstBlocksFrom(n) => {
                let n = n.min(self.blocks.len());
                if stash.blocks.len() + n != self.blocks.len() {
                    return Err(self.err("stash from a different stage"));
                }
                let input = self.restore_input(stash.input.take())?;
                let (mut x, _) = self.residual_input(mb, input)?;
                let mut blocks = Vec::with_capacity(self.blocks.len());
                for b in &self.blocks[..n] {
                    let (y, s) = b.forward_seq(x, tp, self.sp)?;
                    blocks.push(s);
                    x = y;
                }
                blocks.append(&mut stash.blocks);
                stash.blocks = blocks;
                stash.keep = Keep::All;
                Ok(stash)
            }
        }
    }

    /// A kept stage input as storage again (moved where it was kept in f32).
    fn restore_input(&self, input: Option<B::Kept>) -> Result<Option<B::Storage>> {
        input.map(|k| self.be.restore_owned(k)).transpose()
    }

    /// The residual stream entering the first block: the stage input, rounded as the
    /// blocks' outputs are stored (the one start of the stream for forward and recompute).
    fn residual_input(
        &self,
        mb: &Microbatch<'_>,
        input: Option<B::Storage>,
    ) -> Result<(B::Storage, Option<Ids>)> {
        let (mut x, ids) = self.stage_input(mb, input)?;
        // The embedding starts the residual stream, stored like the blocks' outputs.
        self.backend().round_activation(&mut x)?;
        match (self.sp, &ids) {
            // The embedding is replicated; each rank keeps its slice of it.
            (Some(t), Some(_)) => Ok((seq::take_slice(&*self.be, &x, t)?, ids)),
            _ => Ok((x, ids)),
        }
    }

    /// Checks and produces the activations entering the first block.
    fn stage_input(
        &self,
        mb: &Microbatch<'_>,
        input: Option<B::Storage>,
    ) -> Result<(B::Storage, Option<Ids>)> {
        if mb.seq == 0 || mb.seq > self.cfg.seq_len {
            return Err(self.err(format!(
                "sequence length {} (max {})",
                mb.seq, self.cfg.seq_len
            )));
        }
        // Under sequence parallelism the stage's input is this rank's slice.
        let rows_in = match self.sp {
            Some(t) => seq::slice_len(mb.seq, t)?,
            None => mb.seq,
        };
        match (&self.embed, input) {
            (Some(e), None) => {
                let x = e.forward(mb.tokens, mb.seq)?;
                Ok((x, Some((mb.tokens.to_vec(), mb.seq))))
            }
            (None, Some(x)) => {
                let d = self.cfg.d_model;
                if x.shape().len() != 3 || x.shape()[1] != rows_in || x.shape()[2] != d {
                    return Err(shape_err(
                        "GptStage::forward",
                        format!("input {:?}, want [batch, {rows_in}, {d}]", x.shape()),
                    ));
                }
                Ok((x, None))
            }
            (Some(_), Some(_)) => Err(self.err("the first stage embeds tokens; got activations")),
            (None, None) => Err(self.err("a non-first stage needs input activations")),
        }
    }

    /// Input backward (I) of one microbatch: consumes its [`Stash`] and
    /// returns the gradient for the previous stage (`None` on the first
    /// stage) and the [`WeightStash`] for [`GptStage::backward_weight`].
    /// `grad_out` is `None` on the last stage (the loss seeds the gradient)
    /// and the next stage's input gradient elsewhere.
    pub fn backward_input(
        &self,
        stash: Stash<B>,
        grad_out: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(Option<B::Storage>, WeightStash<B>)> {
        if stash.keep != Keep::All {
            return Err(self.err("the stash was not recomputed before the backward"));
        }
        let (mut dy, head) = match (&self.head, stash.head, grad_out) {
            (Some(h), Some(hs), None) => {
                let (dx, ws) = h.backward_input(hs)?;
                // The head ran on the gathered stream; every rank has its whole gradient.
                let dx = match self.sp {
                    Some(t) => seq::take_slice(&*self.be, &dx, t)?,
                    None => dx,
                };
                (dx, Some(ws))
            }
            (None, None, Some(g)) => (g, None),
            (Some(_), _, Some(_)) => {
                return Err(self.err("the last stage takes no output gradient"))
            }
            (None, _, None) => return Err(self.err("a non-last stage needs an output gradient")),
            _ => return Err(self.err("stash from a different stage")),
        };
        if stash.blocks.len() != self.blocks.len() {
            return Err(self.err("stash from a different stage"));
        }
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for (b, s) in self.blocks.iter().zip(stash.blocks).rev() {
            let (dx, ws) = b.backward_input_seq(s, dy, tp, self.sp)?;
            blocks.push(ws);
            dy = dx;
        }
        blocks.reverse();
        if let (Some(t), Some(_)) = (self.sp, &stash.ids) {
            // The replicated embedding's gradient reads the whole stream's.
            dy = seq::gather(&*self.be, tp, &dy, t)?;
        }
        let ws = match stash.ids {
            Some((ids, seq)) => WeightStash {
                embed: Some((ids, seq, self.be.keep(dy)?)),
                blocks,
                head,
            },
            None => {
                return Ok((
                    Some(dy),
                    WeightStash {
                        embed: None,
                        blocks,
                        head,
                    },
                ))
            }
        };
        Ok((None, ws))
    }

    /// Weight backward (W) of one microbatch: accumulates every parameter's
    /// gradient from its [`WeightStash`].
    pub fn backward_weight(&mut self, ws: WeightStash<B>) -> Result<()> {
        if ws.blocks.len() != self.blocks.len() || ws.head.is_some() != self.head.is_some() {
            return Err(self.err("weight stash from a different stage"));
        }
        if let (Some(h), Some(hw)) = (&mut self.head, ws.head) {
            h.backward_weight(hw)?;
        }
        for (b, w) in self.blocks.iter_mut().zip(ws.blocks) {
            b.backward_weight(w)?;
        }
        if let (Some(e), Some((ids, seq, dy))) = (&mut self.embed, ws.embed) {
            e.backward_weight(&ids, seq, &*self.be.restore(&dy)?)?;
        }
        Ok(())
    }

    /// Full backward (B): exactly [`GptStage::backward_input`] followed by
    /// [`GptStage::backward_weight`].
    pub fn backward(
        &mut self,
        stash: Stash<B>,
        grad_out: Option<B::Storage>,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<Option<B::Storage>> {
        let (dx, ws) = self.backward_input(stash, grad_out, tp)?;
        self.backward_weight(ws)?;
        Ok(dx)
    }
}
