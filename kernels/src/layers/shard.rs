//! How a full weight is cut into tensor-parallel shards.
//!
//! Column split (output features, [`shard_col_segments`]): the columns are
//! seen as consecutive segments and each segment is cut into `size`
//! contiguous blocks; rank `r` keeps block `r` of every segment, in segment
//! order. With one segment that is the plain Megatron column split; a fused
//! QKV weight has three (Q, then K and V, each `kv_heads * head_dim` wide), so
//! each rank keeps the query heads and the key/value heads they read; a gated
//! MLP's fused gate and up weight has two equal ones. [`shard_cols`] is the
//! case of `groups` equal segments.
//! Row split (input features, [`shard_rows`]): rank `r` keeps the `r`-th
//! contiguous block of rows.

use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;

/// A rank's place in its tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TpShard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
}

impl TpShard {
    /// The group of one.
    pub const SINGLE: TpShard = TpShard { rank: 0, size: 1 };

    /// Rank `rank` of `size`; errors unless `rank < size`.
    pub fn new(rank: usize, size: usize) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(KernelError::Config(format!(
                "tensor-parallel rank {rank} of group size {size}"
            )));
        }
        Ok(Self { rank, size })
    }

    /// Block `rank` of `n` items; errors unless `size` divides `n`.
    pub fn block(&self, n: usize, what: &str) -> Result<std::ops::Range<usize>> {
        if n % self.size != 0 {
            return Err(KernelError::Config(format!(
                "tensor-parallel size {} does not divide {what} ({n})",
                self.size
            )));
        }
        let b = n / self.size;
        Ok(self.rank * b..(self.rank + 1) * b)
    }
}

/// This rank's column shard of `t` (`[rows, cols]`, or a `[cols]` bias) cut
/// into `groups` equal segments.
pub fn shard_cols(t: &Tensor, groups: usize, tp: TpShard) -> Result<Tensor> {
    let cols = t.cols();
    if groups == 0 || cols % groups != 0 {
        return Err(shape_err(
            "shard_cols",
            format!("{cols} columns in {groups} groups"),
        ));
    }
    shard_col_segments(t, &vec![cols / groups; groups], tp)
}

/// This rank's column shard of `t` (`[rows, cols]`, or a `[cols]` bias) whose
/// columns are the consecutive `segments` (widths summing to `cols`).
pub fn shard_col_segments(t: &Tensor, segments: &[usize], tp: TpShard) -> Result<Tensor> {
    let cols = t.cols();
    if segments.is_empty() || segments.iter().sum::<usize>() != cols {
        return Err(shape_err(
            "shard_cols",
            format!("{cols} columns in segments {segments:?}"),
        ));
    }
    let mut blocks = Vec::with_capacity(segments.len());
    let mut start = 0;
    for &seg in segments {
        let b = tp.block(seg, "the output features")?;
        blocks.push(start + b.start..start + b.end);
        start += seg;
    }
    let mut data = Vec::with_capacity(t.numel() / tp.size);
    for row in t.data().chunks_exact(cols.max(1)) {
        for b in &blocks {
            data.extend_from_slice(&row[b.clone()]);
        }
    }
    let mut shape = t.shape().to_vec();
    *shape.last_mut().expect("a tensor with columns") = cols / tp.size;
    Tensor::new(&shape, data)
}

/// This rank's row shard of `t` (`[rows, cols]`).
pub fn shard_rows(t: &Tensor, tp: TpShard) -> Result<Tensor> {
    if t.shape().len() != 2 {
        return Err(shape_err(
            "shard_rows",
            format!("{:?} is not a matrix", t.shape()),
        ));
    }
    let (rows, cols) = (t.shape()[0], t.cols());
    let block = tp.block(rows, "the input features")?;
    let data = t.data()[block.start * cols..block.end * cols].to_vec();
    Tensor::new(&[block.len(), cols], data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_column_split_keeps_heads_together() {
        // 1 row, 3 groups (Q|K|V) of 4 columns, 2 ranks.
        let t = Tensor::new(&[1, 12], (0..12).map(|i| i as f32).collect()).unwrap();
        let r1 = shard_cols(&t, 3, TpShard::new(1, 2).unwrap()).unwrap();
        assert_eq!(r1.data(), &[2.0, 3.0, 6.0, 7.0, 10.0, 11.0]);
        let bias = Tensor::new(&[4], vec![0.0, 1.0, 2.0, 3.0]).unwrap();
        let b0 = shard_cols(&bias, 1, TpShard::new(0, 2).unwrap()).unwrap();
        assert_eq!((b0.shape(), b0.data()), (&[2][..], &[0.0, 1.0][..]));
        assert!(shard_cols(&t, 3, TpShard::new(0, 3).unwrap()).is_err());
    }

    #[test]
    fn unequal_segments_split_each_segment() {
        // Q of 4 columns, K and V of 2 (two query heads per key/value head), 2 ranks.
        let t = Tensor::new(&[1, 8], (0..8).map(|i| i as f32).collect()).unwrap();
        let r1 = shard_col_segments(&t, &[4, 2, 2], TpShard::new(1, 2).unwrap()).unwrap();
        assert_eq!(r1.data(), &[2.0, 3.0, 5.0, 7.0]);
        assert!(shard_col_segments(&t, &[4, 2, 1], TpShard::SINGLE).is_err());
        assert!(shard_col_segments(&t, &[6, 1, 1], TpShard::new(0, 2).unwrap()).is_err());
    }

    #[test]
    fn row_split_takes_contiguous_rows() {
        let t = Tensor::new(&[4, 2], (0..8).map(|i| i as f32).collect()).unwrap();
        let r = shard_rows(&t, TpShard::new(1, 2).unwrap()).unwrap();
        assert_eq!(r.data(), &[4.0, 5.0, 6.0, 7.0]);
        assert!(TpShard::new(2, 2).is_err());
    }
}
