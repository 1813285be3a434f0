//! Causal self-attention core (no projections), on a fused QKV, with as many
//! key/value heads as query heads (multi-head), fewer (grouped-query) or one
//! (multi-query).
//!
//! Layout: `qkv` is `[batch * seq, (heads + 2 * kv_heads) * head_dim]`, each
//! row holding all query heads, then all key heads, then all value heads
//! (`[Q_0 .. Q_{h-1} | K_0 .. K_{g-1} | V_0 .. V_{g-1}]`, each `head_dim`
//! wide). Query head `h` reads key/value head `h / (heads / kv_heads)`, so
//! consecutive query heads share one (as in Llama and Megatron). The output
//! is `[batch, seq, heads * head_dim]`, heads side by side. Every per-head
//! product is one sgemm on strided views of these buffers, so no head is
//! ever copied out.

use super::gemm::{gemm, MatMut, MatRef};
use crate::error::{shape_err, Result};
use crate::tensor::Tensor;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Query heads (local to this tensor-parallel rank).
    pub heads: usize,
    /// Key/value heads (local): `heads` for multi-head attention, fewer for
    /// grouped-query, 1 for multi-query; must divide `heads`.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl AttnShape {
    /// Multi-head attention: one key/value head per query head.
    pub fn mha(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            batch,
            seq,
            heads,
            kv_heads: heads,
            head_dim,
        }
    }

    /// Width of the output rows: all query heads side by side.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of the key (or value) columns: all key/value heads side by side.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of a fused qkv row: queries, keys, values.
    pub fn qkv_width(&self) -> usize {
        self.width() + 2 * self.kv_width()
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads.checked_div(self.kv_heads).unwrap_or(0)
    }

    /// Checks a fused qkv of shape `shape` (shared with the CUDA backend).
    pub fn check(&self, op: &'static str, shape: &[usize]) -> Result<()> {
        let cols = shape.last().copied().unwrap_or(1);
        let rows = shape
            .iter()
            .product::<usize>()
            .checked_div(cols)
            .unwrap_or(0);
        let grouped = self.kv_heads > 0 && self.heads % self.kv_heads == 0;
        if !grouped || rows != self.batch * self.seq || cols != self.qkv_width() {
            return Err(shape_err(op, format!("qkv {shape:?} for {self:?}")));
        }
        Ok(())
    }

    /// Checks the backward's saved probabilities and output gradient.
    pub(crate) fn check_backward(&self, probs: &[usize], dout: &[usize]) -> Result<()> {
        let t = self.seq;
        let dout_numel: usize = dout.iter().product();
        if probs != [self.batch, self.heads, t, t] || dout_numel != self.batch * t * self.width() {
            return Err(shape_err(
                "causal_attention_backward",
                format!("probs {probs:?}, dout {dout:?} for {self:?}"),
            ));
        }
        Ok(())
    }

    /// Offsets of Q of query head `h` and of K, V of the key/value head it
    /// reads, in sequence `b` of a fused qkv buffer.
    fn qkv_offsets(&self, b: usize, h: usize) -> [usize; 3] {
        let row = b * self.seq * self.qkv_width();
        let kv = (h / self.group()) * self.head_dim;
        let k = row + self.width() + kv;
        [row + h * self.head_dim, k, k + self.kv_width()]
    }
}

/// Row-wise causal softmax of a `t x t` score block, in place: entries above
/// the diagonal become exactly 0.
fn causal_softmax(s: &mut [f32], t: usize) {
    for (i, row) in s.chunks_exact_mut(t).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in live.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        live.iter_mut().for_each(|v| *v *= inv);
        masked.iter_mut().for_each(|v| *v = 0.0);
    }
}

/// Forward: `softmax(mask(Q K^T / sqrt(head_dim))) V` per sequence and head.
/// Returns the output `[batch, seq, heads * head_dim]` and the attention
/// probabilities `[batch, heads, seq, seq]` that the backward needs.
pub fn causal_attention(qkv: &Tensor, sh: AttnShape) -> Result<(Tensor, Tensor)> {
    sh.check("causal_attention", qkv.shape())?;
    let (t, dh, w3) = (sh.seq, sh.head_dim, sh.qkv_width());
    let scale = 1.0 / (dh as f32).sqrt();
    let mut probs = vec![0.0f32; sh.batch * sh.heads * t * t];
    let mut out = vec![0.0f32; sh.batch * t * sh.width()];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            let [q, k, v] = sh.qkv_offsets(b, h);
            let p = &mut probs[(b * sh.heads + h) * t * t..][..t * t];
            let qm = MatRef::strided(&qkv.data()[q..], t, dh, w3, 1);
            let km = MatRef::strided(&qkv.data()[k..], t, dh, w3, 1);
            gemm(scale, qm, km.t(), 0.0, MatMut::new(p, t, t));
            causal_softmax(p, t);
            let vm = MatRef::strided(&qkv.data()[v..], t, dh, w3, 1);
            let o = &mut out[b * t * sh.width() + h * dh..];
            gemm(
                1.0,
                MatRef::new(p, t, t),
                vm,
                0.0,
                MatMut::strided(o, t, dh, sh.width()),
            );
        }
    }
    let out = Tensor::from_parts(vec![sh.batch, t, sh.width()], out);
    let probs = Tensor::from_parts(vec![sh.batch, sh.heads, t, t], probs);
    Ok((out, probs))
}

/// Backward: the gradient of the fused `qkv` (same layout) from the output
/// gradient `dout`, the forward's `qkv` and its saved `probs`. A key/value
/// head's gradient sums those of its query heads, in head order.
pub fn causal_attention_backward(
    qkv: &Tensor,
    probs: &Tensor,
    dout: &Tensor,
    sh: AttnShape,
) -> Result<Tensor> {
    sh.check("causal_attention_backward", qkv.shape())?;
    sh.check_backward(probs.shape(), dout.shape())?;
    let t = sh.seq;
    let mut dqkv = vec![0.0f32; qkv.numel()];
    let mut ds = vec![0.0f32; t * t];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            let p = &probs.data()[(b * sh.heads + h) * t * t..][..t * t];
            head_backward(qkv.data(), p, dout.data(), &mut dqkv, &mut ds, sh, b, h);
        }
    }
    Ok(Tensor::from_parts(qkv.shape().to_vec(), dqkv))
}

/// One (sequence, head) of the backward. With `S` the scaled scores and `P`
/// their causal softmax: `dV = P^T dO`, `dP = dO V^T`,
/// `dS = P * (dP - rowsum(P * dP))`, `dQ = scale dS K`, `dK = scale dS^T Q`.
/// The first query head of a group writes its key/value head's `dK`, `dV`;
/// the others add to them.
#[allow(clippy::too_many_arguments)]
fn head_backward(
    qkv: &[f32],
    p: &[f32],
    dout: &[f32],
    dqkv: &mut [f32],
    ds: &mut [f32],
    sh: AttnShape,
    b: usize,
    h: usize,
) {
    let (t, dh, w, w3) = (sh.seq, sh.head_dim, sh.width(), sh.qkv_width());
    let scale = 1.0 / (dh as f32).sqrt();
    let [q, k, v] = sh.qkv_offsets(b, h);
    let kv_beta = if h % sh.group() == 0 { 0.0 } else { 1.0 };
    let pm = MatRef::new(p, t, t);
    let dom = MatRef::strided(&dout[b * t * w + h * dh..], t, dh, w, 1);
    let vm = MatRef::strided(&qkv[v..], t, dh, w3, 1);
    gemm(
        1.0,
        pm.t(),
        dom,
        kv_beta,
        MatMut::strided(&mut dqkv[v..], t, dh, w3),
    );
    gemm(1.0, dom, vm.t(), 0.0, MatMut::new(ds, t, t));
    for (prow, drow) in p.chunks_exact(t).zip(ds.chunks_exact_mut(t)) {
        let dot: f32 = prow.iter().zip(drow.iter()).map(|(a, b)| a * b).sum();
        for (d, &pv) in drow.iter_mut().zip(prow) {
            // Masked entries have p == 0, so their gradient is exactly 0 too.
            *d = pv * (*d - dot);
        }
    }
    let dsm = MatRef::new(ds, t, t);
    let qm = MatRef::strided(&qkv[q..], t, dh, w3, 1);
    let km = MatRef::strided(&qkv[k..], t, dh, w3, 1);
    gemm(
        scale,
        dsm,
        km,
        0.0,
        MatMut::strided(&mut dqkv[q..], t, dh, w3),
    );
    gemm(
        scale,
        dsm.t(),
        qm,
        kv_beta,
        MatMut::strided(&mut dqkv[k..], t, dh, w3),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_token_attends_only_to_itself() {
        let sh = AttnShape::mha(1, 3, 2, 2);
        let data: Vec<f32> = (0..3 * 12).map(|i| (i as f32 * 0.37).sin()).collect();
        let qkv = Tensor::new(&[3, 12], data).unwrap();
        let (out, probs) = causal_attention(&qkv, sh).unwrap();
        // Row 0 of each head's probs is [1, 0, 0]; output row 0 is V's row 0.
        for h in 0..2 {
            assert_eq!(&probs.data()[h * 9..h * 9 + 3], &[1.0, 0.0, 0.0]);
            for j in 0..2 {
                assert_eq!(out.data()[h * 2 + j], qkv.data()[8 + h * 2 + j]);
            }
        }
        for row in probs.data().chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        let bad = AttnShape { heads: 3, ..sh };
        assert!(causal_attention(&qkv, bad).is_err());
    }
}
