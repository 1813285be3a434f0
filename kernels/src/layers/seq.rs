//! Sequence parallelism (Korthikanti et al. 2022): outside the tensor-parallel
//! regions (LayerNorm, the residual stream, the pipeline hand-offs) a TP rank
//! holds only its `seq / t` slice of every sequence.
//!
//! A slice is `[batch, seq / t, d]`: rank `r` keeps positions
//! `r * seq/t .. (r+1) * seq/t` of every sequence of the microbatch. Our
//! activations are batch-major (`[batch, seq, d]`, Megatron's are `[seq,
//! batch, d]`), so a slice is `batch` separate runs of rows; the helpers here
//! reorder between that and the group-major layout the flat collectives
//! of [`TpReduce`] use (`[t, batch, seq / t, d]`). With `batch = 1` the two
//! layouts coincide and nothing is reordered.
//!
//! The collectives sum in the group's order, so a reduce-scattered slice holds
//! exactly the bits of the all-reduced rows it replaces.

use super::shard::TpShard;
use super::TpReduce;
use crate::backend::{Backend, Shaped};
use crate::error::{shape_err, KernelError, Result};

/// `[batch, seq, d]` of a 3-D activation.
fn dims<S: Shaped>(x: &S, op: &'static str) -> Result<(usize, usize, usize)> {
    match *x.shape() {
        [b, s, d] => Ok((b, s, d)),
        _ => Err(shape_err(
            op,
            format!("{:?} is not [batch, seq, d]", x.shape()),
        )),
    }
}

/// Rows per slice of a sequence of `seq` positions; errors unless `t` divides it.
pub fn slice_len(seq: usize, tp: TpShard) -> Result<usize> {
    if seq % tp.size != 0 {
        return Err(KernelError::Config(format!(
            "sequence parallelism: the sequence length {seq} is not divisible by the \
             tensor-parallel size {}",
            tp.size
        )));
    }
    Ok(seq / tp.size)
}

/// Copies `len` values from `src` at `from` to `dst` at `to` (through a
/// temporary: the backend's offset copies move whole tensors).
fn move_run<B: Backend>(
    be: &B,
    src: &B::Storage,
    from: usize,
    dst: &mut B::Storage,
    to: usize,
    len: usize,
) -> Result<()> {
    let mut tmp = be.zeros(&[len])?;
    be.copy_from_offset(src, from, &mut tmp)?;
    be.copy_to_offset(&tmp, dst, to)
}

/// This rank's slice `[batch, seq / t, d]` of a whole activation `x`
/// (`[batch, seq, d]`), e.g. of the embedding's output or a replicated gradient.
pub fn take_slice<B: Backend>(be: &B, x: &B::Storage, tp: TpShard) -> Result<B::Storage> {
    let (b, s, d) = dims(x, "take_slice")?;
    let sl = slice_len(s, tp)?;
    let mut out = be.zeros(&[b, sl, d])?;
    if b == 1 {
        be.copy_from_offset(x, tp.rank * sl * d, &mut out)?;
        return Ok(out);
    }
    for i in 0..b {
        move_run(
            be,
            x,
            (i * s + tp.rank * sl) * d,
            &mut out,
            i * sl * d,
            sl * d,
        )?;
    }
    Ok(out)
}

/// The whole activation `[batch, seq, d]` from every rank's slice (an
/// all-gather along the sequence): what a column-parallel linear reads.
pub fn gather<B: Backend>(
    be: &B,
    comm: &mut dyn TpReduce<B::Storage>,
    x: &B::Storage,
    tp: TpShard,
) -> Result<B::Storage> {
    if tp.size == 1 {
        return be.copy(x);
    }
    let (b, sl, d) = dims(x, "sequence all-gather")?;
    let parts = comm.all_gather(x)?;
    if parts.len() != tp.size || parts.iter().any(|p| p.numel() != x.numel()) {
        return Err(shape_err(
            "sequence all-gather",
            format!(
                "{} parts from a group of {} (each {} values)",
                parts.len(),
                tp.size,
                x.numel()
            ),
        ));
    }
    let s = sl * tp.size;
    let mut out = be.zeros(&[b, s, d])?;
    for (r, part) in parts.iter().enumerate() {
        if b == 1 {
            be.copy_to_offset(part, &mut out, r * sl * d)?;
            continue;
        }
        for i in 0..b {
            move_run(be, part, i * sl * d, &mut out, (i * s + r * sl) * d, sl * d)?;
        }
    }
    Ok(out)
}

/// This rank's slice of the group's sum of `y` (`[batch, seq, d]`, a
/// row-parallel linear's partial sum): a reduce-scatter along the sequence,
/// in place of the all-reduce.
pub fn scatter<B: Backend>(
    be: &B,
    comm: &mut dyn TpReduce<B::Storage>,
    y: B::Storage,
    tp: TpShard,
) -> Result<B::Storage> {
    if tp.size == 1 {
        return Ok(y);
    }
    let (b, s, d) = dims(&y, "sequence reduce-scatter")?;
    let sl = slice_len(s, tp)?;
    let grouped = if b == 1 {
        y
    } else {
        let mut g = be.zeros(&[y.numel()])?;
        for r in 0..tp.size {
            for i in 0..b {
                move_run(
                    be,
                    &y,
                    (i * s + r * sl) * d,
                    &mut g,
                    (r * b + i) * sl * d,
                    sl * d,
                )?;
            }
        }
        g
    };
    let mine = comm.reduce_scatter_sum(&grouped)?;
    let mut out = be.zeros(&[b, sl, d])?;
    if mine.numel() != out.numel() {
        return Err(shape_err(
            "sequence reduce-scatter",
            format!("a shard of {} values, want {}", mine.numel(), out.numel()),
        ));
    }
    be.copy_from_offset(&mine, 0, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;
    use crate::tensor::Tensor;

    /// A group of two simulated in one thread: both ranks' inputs are known.
    struct Two {
        other: Tensor,
        rank: usize,
    }

    impl TpReduce for Two {
        fn all_reduce_sum(&mut self, _: &mut Tensor) -> Result<()> {
            unreachable!("sequence parallelism does not all-reduce activations")
        }
        fn all_gather(&mut self, t: &Tensor) -> Result<Vec<Tensor>> {
            let mut v = vec![t.clone(), self.other.clone()];
            if self.rank == 1 {
                v.swap(0, 1);
            }
            Ok(v)
        }
        fn reduce_scatter_sum(&mut self, t: &Tensor) -> Result<Tensor> {
            let mut sum = t.clone();
            sum.add_assign(&self.other)?;
            let n = sum.numel() / 2;
            let part = sum.data()[self.rank * n..(self.rank + 1) * n].to_vec();
            Tensor::new(&[n], part)
        }
    }

    fn seq_tensor(b: usize, s: usize, d: usize, k: f32) -> Tensor {
        let data = (0..b * s * d).map(|i| k * i as f32).collect();
        Tensor::new(&[b, s, d], data).unwrap()
    }

    #[test]
    fn gather_undoes_take_slice() {
        let x = seq_tensor(3, 4, 2, 1.0);
        let t0 = TpShard::new(0, 2).unwrap();
        let t1 = TpShard::new(1, 2).unwrap();
        let (s0, s1) = (
            take_slice(&Cpu, &x, t0).unwrap(),
            take_slice(&Cpu, &x, t1).unwrap(),
        );
        // Sequence 1's positions 2 and 3 belong to rank 1.
        assert_eq!(&s1.data()[4..8], &x.data()[12..16]);
        let mut two = Two { other: s1, rank: 0 };
        assert_eq!(gather(&Cpu, &mut two, &s0, t0).unwrap(), x);
    }

    #[test]
    fn scatter_is_the_slice_of_the_sum() {
        let (a, b) = (seq_tensor(2, 4, 3, 1.0), seq_tensor(2, 4, 3, 0.5));
        let t1 = TpShard::new(1, 2).unwrap();
        let grouped_b = {
            // What rank 0 hands the collective: its own tensor in group-major order.
            let mut g = Tensor::zeros(&[b.numel()]);
            for r in 0..2 {
                for i in 0..2 {
                    let src = &b.data()[(i * 4 + r * 2) * 3..][..6];
                    g.data_mut()[(r * 2 + i) * 6..][..6].copy_from_slice(src);
                }
            }
            g
        };
        let mut two = Two {
            other: grouped_b,
            rank: 1,
        };
        let got = scatter(&Cpu, &mut two, a.clone(), t1).unwrap();
        let mut sum = a;
        sum.add_assign(&b).unwrap();
        assert_eq!(got, take_slice(&Cpu, &sum, t1).unwrap());
        assert!(slice_len(5, t1).is_err());
    }
}
