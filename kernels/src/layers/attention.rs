//! Causal self-attention split by heads across TP ranks: multi-head, or with
//! fewer key/value heads than query heads (grouped-query attention; one for
//! multi-query).
//!
//! The fused QKV projection is column-parallel with three column segments
//! (see [`shard_col_segments`](super::shard::shard_col_segments)): Q of
//! `heads * head_dim` columns, then K and V of `kv_heads * head_dim` each.
//! Rank `r` owns query heads `r * h/tp .. (r+1) * h/tp` and key/value heads
//! `r * g/tp .. (r+1) * g/tp`, which are exactly those its query heads read,
//! so the attention core runs on local heads only. As in Megatron, the TP
//! size must divide the key/value heads (a group is never split, nor a
//! key/value head replicated). The output projection is row-parallel over
//! the query head blocks, so its forward is a partial sum that the caller
//! all-reduces.
//!
//! With rotary positions ([`Attention::with_rotary`]) the queries and keys are turned by
//! their positions between the QKV projection and the core ([`crate::cpu::rotary`]). The
//! stash keeps the turned `qkv` in place of the projection's output (the same size): the
//! core's backward reads the turned values, and the rotation's own backward (the inverse
//! rotation) needs no activation, so rotary positions add nothing to a stash and a
//! recomputed core reads the forward's bits.

use super::linear::{ColumnParallelLinear, RowParallelLinear};
use super::shard::TpShard;
use super::{cpu_backend, seq, Parameters, TpReduce};
use crate::backend::{Backend, Shaped};
use crate::cpu::rotary::Turn;
use crate::cpu::AttnShape;
use crate::cpu::Cpu;
use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;
use std::sync::Arc;

/// A TP rank's share of an attention layer (the whole layer when `tp = 1`).
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, qkv.local, proj.local)]
pub struct Attention<B: Backend = Cpu> {
    /// Fused `[d, (heads + 2 * kv_heads) * head_dim / tp]` projection of this
    /// rank's heads.
    pub qkv: ColumnParallelLinear<B>,
    /// `[d / tp, d]` output projection with the full bias.
    pub proj: RowParallelLinear<B>,
    heads: Heads,
    head_dim: usize,
    /// The rotary table (`[positions, head_dim]` cosines and sines) where positions are
    /// rotary, shared by the blocks of a stage.
    rotary: Option<Arc<B::Storage>>,
}

super::clone_if_tensors_clone!(Attention {
    qkv,
    proj,
    heads,
    head_dim,
    rotary
});

/// Query and key/value heads of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Heads {
    /// Query heads.
    pub query: usize,
    /// Key/value heads: `query` (multi-head), a divisor of it (grouped-query)
    /// or 1 (multi-query).
    pub kv: usize,
}

impl Heads {
    /// Multi-head attention: one key/value head per query head.
    pub fn mha(heads: usize) -> Self {
        Self {
            query: heads,
            kv: heads,
        }
    }

    /// Errors unless both counts are positive, the key/value heads divide the
    /// query heads and `tp` divides the key/value heads (then the query heads too).
    pub fn check(&self, tp: usize) -> Result<()> {
        let Heads { query, kv } = *self;
        if query == 0 || kv == 0 || query % kv != 0 {
            return Err(KernelError::Config(format!(
                "{kv} key/value heads do not divide {query} query heads"
            )));
        }
        if kv % tp.max(1) != 0 {
            return Err(KernelError::Config(format!(
                "the key/value heads ({kv}) must be divisible by the tensor-parallel size {tp}"
            )));
        }
        Ok(())
    }
}

/// What the attention input backward needs; its tensors are kept in the backend's
/// activation format ([`Backend::keep`]).
#[derive(Debug)]
pub struct AttentionStash<B: Backend = Cpu> {
    x: B::Kept,
    /// What the core read: the projection's output, its queries and keys turned where
    /// positions are rotary.
    qkv: B::Kept,
    /// The backend's own record of the attention core (probabilities on the
    /// CPU, logsumexp on a GPU); `None` once dropped for selective
    /// recomputation, until [`Attention::recompute_core`] rebuilds it.
    core: Option<B::AttnStash>,
    ctx: B::Kept,
    shape: AttnShape,
}

super::clone_if_tensors_clone!(AttentionStash {
    x,
    qkv,
    core,
    ctx,
    shape
});
super::footprint_of!(AttentionStash { x, qkv, core, ctx });

impl<B: Backend> AttentionStash<B> {
    /// Drops the attention core's record (the `[batch, heads, seq, seq]`
    /// probabilities on the CPU): selective recomputation keeps the rest.
    pub fn drop_core(&mut self) {
        self.core = None;
    }
}

/// What the attention weight backward needs.
#[derive(Debug)]
pub struct AttentionWeightStash<B: Backend = Cpu> {
    x: B::Kept,
    dqkv: B::Kept,
    ctx: B::Kept,
    dy: B::Kept,
}

super::clone_if_tensors_clone!(AttentionWeightStash { x, dqkv, ctx, dy });
super::footprint_of!(AttentionWeightStash { x, dqkv, ctx, dy });

impl Attention {
    /// This rank's share of attention with `heads` heads in total and full
    /// weights `w_qkv [d, 3d]` (columns `[Q | K | V]`, head-major in each),
    /// `b_qkv [3d]`, `w_o [d, d]`, `b_o [d]`.
    pub fn from_full(
        name: &str,
        heads: usize,
        w_qkv: &Tensor,
        b_qkv: &Tensor,
        w_o: &Tensor,
        b_o: &Tensor,
        tp: TpShard,
    ) -> Result<Self> {
        Self::from_full_on(&cpu_backend(), name, heads, w_qkv, b_qkv, w_o, b_o, tp)
    }
}

impl<B: Backend> Attention<B> {
    /// [`Attention::from_full`], with the shard uploaded to `be`.
    #[allow(clippy::too_many_arguments)] // from_full's weights, plus the backend
    pub fn from_full_on(
        be: &Arc<B>,
        name: &str,
        heads: usize,
        w_qkv: &Tensor,
        b_qkv: &Tensor,
        w_o: &Tensor,
        b_o: &Tensor,
        tp: TpShard,
    ) -> Result<Self> {
        let (qkv, out) = ((w_qkv, Some(b_qkv)), (w_o, Some(b_o)));
        Self::grouped_from_full_on(be, name, Heads::mha(heads), qkv, out, tp)
    }

    /// This rank's share of attention with `heads` query and key/value heads
    /// and full weights `w_qkv [d, (query + 2 * kv) * d / query]` (columns
    /// `[Q | K | V]`, head-major in each) and `w_o [d, d]`, each with its
    /// bias (`[(query + 2 * kv) * d / query]`, `[d]`) or none.
    pub fn grouped_from_full_on(
        be: &Arc<B>,
        name: &str,
        heads: Heads,
        (w_qkv, b_qkv): (&Tensor, Option<&Tensor>),
        (w_o, b_o): (&Tensor, Option<&Tensor>),
        tp: TpShard,
    ) -> Result<Self> {
        let d = w_o.cols();
        heads.check(tp.size)?;
        if d % heads.query != 0 {
            return Err(KernelError::Config(format!(
                "{} heads do not divide d_model {d}",
                heads.query
            )));
        }
        let head_dim = d / heads.query;
        let local = Heads {
            query: tp.block(heads.query, "the number of heads")?.len(),
            kv: tp.block(heads.kv, "the key/value heads")?.len(),
        };
        let kv = heads.kv * head_dim;
        let qkv_name = format!("{name}.qkv");
        Ok(Self {
            qkv: ColumnParallelLinear::from_segments_on(
                be,
                &qkv_name,
                w_qkv,
                b_qkv,
                &[d, kv, kv],
                tp,
            )?,
            proj: RowParallelLinear::from_full_on(be, &format!("{name}.proj"), w_o, b_o, tp)?,
            heads: local,
            head_dim,
            rotary: None,
        })
    }

    /// This attention with rotary positions: queries and keys turned by `table`, the
    /// cosines and sines of [`crate::cpu::rotary_table`] (uploaded) for at least the
    /// longest sequence's positions at this attention's head width.
    pub fn with_rotary(mut self, table: Arc<B::Storage>) -> Result<Self> {
        match *table.shape() {
            [_, dh] if dh == self.head_dim && dh % 2 == 0 => {}
            _ => {
                return Err(KernelError::Config(format!(
                    "a rotary table {:?} for heads of width {} (it needs an even width)",
                    table.shape(),
                    self.head_dim
                )))
            }
        }
        self.rotary = Some(table);
        Ok(self)
    }

    /// Whether queries and keys are turned by rotary positions.
    pub fn is_rotary(&self) -> bool {
        self.rotary.is_some()
    }

    fn shape_of(&self, x: &B::Storage) -> Result<AttnShape> {
        match *x.shape() {
            [batch, seq, _] => Ok(AttnShape {
                batch,
                seq,
                heads: self.heads.query,
                kv_heads: self.heads.kv,
                head_dim: self.head_dim,
            }),
            _ => Err(shape_err(
                "Attention",
                format!("input {:?} is not [batch, seq, d]", x.shape()),
            )),
        }
    }

    /// Forward up to the output projection's partial sum (no bias, not reduced).
    pub fn forward_partial(&self, x: B::Storage) -> Result<(B::Storage, AttentionStash<B>)> {
        self.forward_keeping(x, None)
    }

    /// [`Attention::forward_partial`], keeping `kept_input` in place of `x` where given
    /// (sequence parallelism keeps the slice, not the gathered input).
    fn forward_keeping(
        &self,
        x: B::Storage,
        kept_input: Option<B::Kept>,
    ) -> Result<(B::Storage, AttentionStash<B>)> {
        let shape = self.shape_of(&x)?;
        let be = self.qkv.local.backend();
        let mut qkv = self.qkv.local.forward(&x)?;
        // The core reads the values its stash keeps, so a core rebuilt from the kept qkv
        // (selective recomputation) or a GPU backward recomputing the probabilities from it
        // sees the forward's own bits.
        be.round_activation(&mut qkv)?;
        if let Some(table) = &self.rotary {
            // Positions are the rows' places in the whole sequence: under sequence
            // parallelism the input was gathered before the projection. The turned values
            // are stored as the projection's output is (a bf16 run rounds them again).
            be.rotary(&mut qkv, table, shape, Turn::Forward)?;
            be.round_activation(&mut qkv)?;
        }
        let (ctx, core) = be.causal_attention(&qkv, shape)?;
        let y = self.proj.forward_partial(&ctx)?;
        let x = match kept_input {
            Some(k) => k,
            None => be.keep(x)?,
        };
        let stash = AttentionStash {
            x,
            qkv: be.keep(qkv)?,
            core: Some(core),
            ctx: be.keep(ctx)?,
            shape,
        };
        Ok((y, stash))
    }

    /// Rebuilds a dropped attention core from the stashed `qkv` (the
    /// forward's own computation, so the same bits); the context the forward
    /// kept is left as it was. A stash that still has its core is unchanged.
    pub fn recompute_core(&self, stash: &mut AttentionStash<B>) -> Result<()> {
        if stash.core.is_none() {
            let be = self.qkv.local.backend();
            let (_, core) = be.causal_attention(&*be.restore(&stash.qkv)?, stash.shape)?;
            stash.core = Some(core);
        }
        Ok(())
    }

    /// Full forward: partial sum, all-reduce, output bias.
    pub fn forward(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, AttentionStash<B>)> {
        let (mut y, stash) = self.forward_partial(x)?;
        tp.all_reduce_sum(&mut y)?;
        self.proj.add_bias(&mut y)?;
        Ok((y, stash))
    }

    /// Sequence-parallel forward ([`seq`]): `x` is this rank's slice
    /// `[batch, seq / t, d]`, all-gathered before the QKV projection; the
    /// output projection's partial sums are reduce-scattered back to the
    /// slice in place of the all-reduce. The stash keeps the slice, not the
    /// gathered input: the input backward gathers it again for W.
    pub fn forward_seq(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        shard: TpShard,
    ) -> Result<(B::Storage, AttentionStash<B>)> {
        let be = self.qkv.local.backend().clone();
        let full = seq::gather(&*be, tp, &x, shard)?;
        let (y, stash) = self.forward_keeping(full, Some(be.keep(x)?))?;
        let mut y = seq::scatter(&*be, tp, y, shard)?;
        self.proj.add_bias(&mut y)?;
        Ok((y, stash))
    }

    /// Sequence-parallel input backward: `dy` is the output gradient's slice;
    /// it and the stashed input slice are all-gathered (the weight stash keeps
    /// both whole), the input gradient's partial sums reduce-scattered.
    pub fn backward_input_seq(
        &self,
        mut stash: AttentionStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        shard: TpShard,
    ) -> Result<(B::Storage, AttentionWeightStash<B>)> {
        let be = self.qkv.local.backend().clone();
        let full = seq::gather(&*be, tp, &*be.restore(&stash.x)?, shard)?;
        stash.x = be.keep(full)?;
        let dy = seq::gather(&*be, tp, &dy, shard)?;
        let (dx, ws) = self.backward_input_partial(stash, dy)?;
        Ok((seq::scatter(&*be, tp, dx, shard)?, ws))
    }

    /// Input backward up to the partial input gradient (not reduced).
    pub fn backward_input_partial(
        &self,
        stash: AttentionStash<B>,
        dy: B::Storage,
    ) -> Result<(B::Storage, AttentionWeightStash<B>)> {
        let core = stash.core.as_ref().ok_or_else(|| {
            KernelError::Config("the attention core was dropped and not recomputed".into())
        })?;
        let dctx = self.proj.local.backward_input(&dy)?;
        let be = self.qkv.local.backend();
        let (qkv, ctx) = (be.restore(&stash.qkv)?, be.restore(&stash.ctx)?);
        let mut dqkv = be.causal_attention_backward(&qkv, &ctx, core, &dctx, stash.shape)?;
        if let Some(table) = &self.rotary {
            // The gradient of the turned queries and keys, turned back: that of the projection's.
            be.rotary(&mut dqkv, table, stash.shape, Turn::Inverse)?;
        }
        let dx = self.qkv.local.backward_input(&dqkv)?;
        let ws = AttentionWeightStash {
            x: stash.x,
            dqkv: be.keep(dqkv)?,
            ctx: stash.ctx,
            dy: be.keep(dy)?,
        };
        Ok((dx, ws))
    }

    /// Input backward (I): the full input gradient after the all-reduce.
    pub fn backward_input(
        &self,
        stash: AttentionStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, AttentionWeightStash<B>)> {
        let (mut dx, ws) = self.backward_input_partial(stash, dy)?;
        tp.all_reduce_sum(&mut dx)?;
        Ok((dx, ws))
    }

    /// Weight backward (W).
    pub fn backward_weight(&mut self, ws: AttentionWeightStash<B>) -> Result<()> {
        let be = self.qkv.local.backend().clone();
        let (x, dqkv) = (be.restore(&ws.x)?, be.restore(&ws.dqkv)?);
        self.qkv.local.backward_weight(&x, &dqkv)?;
        let (ctx, dy) = (be.restore(&ws.ctx)?, be.restore(&ws.dy)?);
        self.proj.local.backward_weight(&ctx, &dy)
    }
}
