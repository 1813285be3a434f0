//! How a full weight is cut into tensor-parallel shards.
//!
//! Column split (output features, [`shard_cols`]): the columns are seen as
//! `groups` equal segments and each segment is cut into `size` contiguous
//! blocks; rank `r` keeps block `r` of every segment, in segment order. With
//! `groups = 1` that is the plain Megatron column split; a fused QKV weight
//! uses `groups = 3`, so each rank keeps the Q, K and V columns of its heads.
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

/// This rank's column shard of `t` (`[rows, cols]`, or a `[cols]` bias).
pub fn shard_cols(t: &Tensor, groups: usize, tp: TpShard) -> Result<Tensor> {
    let cols = t.cols();
    if groups == 0 || cols % groups != 0 {
        return Err(shape_err(
            "shard_cols",
            format!("{cols} columns in {groups} groups"),
        ));
    }
    let seg = cols / groups;
    let block = tp.block(seg, "the output features")?;
    let mut data = Vec::with_capacity(t.numel() / tp.size);
    for row in t.data().chunks_exact(cols.max(1)) {
        for g in 0..groups {
            data.extend_from_slice(&row[g * seg + block.start..g * seg + block.end]);
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
    fn row_split_takes_contiguous_rows() {
        let t = Tensor::new(&[4, 2], (0..8).map(|i| i as f32).collect()).unwrap();
        let r = shard_rows(&t, TpShard::new(1, 2).unwrap()).unwrap();
        assert_eq!(r.data(), &[4.0, 5.0, 6.0, 7.0]);
        assert!(TpShard::new(2, 2).is_err());
    }
}
