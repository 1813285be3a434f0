//! Expert parallelism: the all-to-all a mixture needs, and the host-side layout of the
//! rows it sends.
//!
//! With `ep` ranks, rank `r` holds experts `r * E / ep .. (r + 1) * E / ep` (contiguous, as
//! Megatron-Core's). Each rank routes its own tokens, sends every other rank the rows for
//! that rank's experts (expert by expert, in token order), runs its experts on the rows it
//! receives (each expert's rows source by source, in rank order), and sends the outputs
//! back the same way. The backward retraces it with gradients.

use super::route::{gather_rows, Routing};
use crate::error::{shape_err, Result};
use crate::tensor::Tensor;

/// The all-to-all of an expert-parallel group, supplied by the runtime. Called in the
/// same order on every rank of the group.
pub trait ExpertExchange {
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// This rank's index in it.
    fn rank(&self) -> usize;
    /// Sends `send[r]` to rank `r` (one tensor per rank, this rank's own included) and
    /// returns what each rank sent to this one, in rank order.
    fn all_to_all(&mut self, send: Vec<Tensor>) -> Result<Vec<Tensor>>;
}

/// The exchange of a group of one: hands the message back.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEp;

impl ExpertExchange for NoEp {
    fn size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_to_all(&mut self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        Ok(send)
    }
}

/// The token side of a dispatch: for each destination rank, the `(token, slot)` pairs it
/// was sent, in send order, and how many of them went to each of its experts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sent {
    pub rows: Vec<Vec<(usize, usize)>>,
    pub counts: Vec<Vec<usize>>,
}

impl Sent {
    /// The layout of `routing` over `ranks` ranks of `local` experts each.
    pub fn plan(routing: &Routing, ranks: usize, local: usize) -> Self {
        let (mut rows, mut counts) = (Vec::new(), Vec::new());
        for r in 0..ranks {
            let (mut rr, mut cc) = (Vec::new(), Vec::new());
            for e in r * local..(r + 1) * local {
                let a = routing.assigned(e);
                cc.push(a.len());
                rr.extend(a);
            }
            rows.push(rr);
            counts.push(cc);
        }
        Self { rows, counts }
    }

    /// Each destination's rows of `x` (`[T, d]`), gathered in send order.
    pub fn gather(&self, x: &Tensor) -> Vec<Tensor> {
        self.rows
            .iter()
            .map(|rr| gather_rows(x, rr.iter().map(|r| r.0)))
            .collect()
    }

    /// The counts as tensors, one per destination (exact in f32 below 2^24 rows).
    pub fn count_messages(&self) -> Vec<Tensor> {
        self.counts
            .iter()
            .map(|c| {
                let v = c.iter().map(|&n| n as f32).collect::<Vec<_>>();
                Tensor::from_parts(vec![v.len()], v)
            })
            .collect()
    }
}

/// Counts received from each source, `[source][local expert]`.
pub(crate) fn counts_of(msgs: &[Tensor], local: usize) -> Result<Vec<Vec<usize>>> {
    msgs.iter()
        .map(|m| {
            if m.numel() != local {
                return Err(shape_err(
                    "expert all-to-all",
                    format!("{} counts for {local} local experts", m.numel()),
                ));
            }
            Ok(m.data().iter().map(|&v| v as usize).collect())
        })
        .collect()
}

/// The rows of local expert `j` from every source (`recv[s]` holds source `s`'s rows,
/// expert by expert), stacked source by source.
pub(crate) fn assemble(recv: &[Tensor], counts: &[Vec<usize>], j: usize, d: usize) -> Tensor {
    let mut data = Vec::new();
    for (m, c) in recv.iter().zip(counts) {
        let start: usize = c[..j].iter().sum();
        data.extend_from_slice(&m.data()[start * d..(start + c[j]) * d]);
    }
    let n = data.len() / d.max(1);
    Tensor::from_parts(vec![n, d], data)
}

/// The inverse of [`assemble`]: the local experts' outputs (`outs[j]`, or `None` for an
/// expert that got no rows) cut back into one message per source, expert by expert.
pub(crate) fn split_back(outs: &[Option<Tensor>], counts: &[Vec<usize>], d: usize) -> Vec<Tensor> {
    let mut offsets = vec![0usize; outs.len()];
    counts
        .iter()
        .map(|c| {
            let mut data = Vec::new();
            for (j, out) in outs.iter().enumerate() {
                if let Some(o) = out {
                    let at = offsets[j];
                    data.extend_from_slice(&o.data()[at * d..(at + c[j]) * d]);
                }
                offsets[j] += c[j];
            }
            let n = data.len() / d.max(1);
            Tensor::from_parts(vec![n, d], data)
        })
        .collect()
}
