//! Expert parallelism in the executor (a mesh with `ep > 1`): the all-to-all the mixtures
//! call through their TP group, the split of a stage's gradients between the data-parallel
//! sum (dense parameters) and the expert-data-parallel one (this rank's experts), and the
//! splice of every EP rank's experts into the final parameters.
//!
//! The mixtures route host tensors, so expert parallelism runs on transports that move host
//! tensors (in-process, MPI); the executor refuses it on others before step 0.

use std::any::Any;
use std::ops::Range;

use pipewright_kernels::layers::moe::ep::ExpertExchange;
use pipewright_kernels::{KernelError, Tensor};

use crate::comm::{CommError, Communicator};
use crate::mesh::Group;

/// `t` as the transport's tensor, when the transport moves host tensors.
pub(crate) fn to_comm<T: 'static>(t: Tensor) -> Result<T, CommError> {
    (Box::new(t) as Box<dyn Any>)
        .downcast::<T>()
        .map(|b| *b)
        .map_err(|_| not_host())
}

/// A transport's tensor as a host tensor, when it is one.
pub(crate) fn to_host<T: 'static>(t: T) -> Result<Tensor, CommError> {
    (Box::new(t) as Box<dyn Any>)
        .downcast::<Tensor>()
        .map(|b| *b)
        .map_err(|_| not_host())
}

/// Whether the transport's tensors are host tensors.
pub(crate) fn moves_host<T: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<Tensor>()
}

fn not_host() -> CommError {
    CommError::Invalid(
        "expert parallelism moves host tensors; this transport moves device tensors".into(),
    )
}

/// The EP group's all-to-all, as the kernels' mixtures call it.
pub(super) struct EpExchange<'a, C> {
    pub(super) comm: &'a C,
    pub(super) group: &'a Group,
}

impl<C: Communicator> ExpertExchange for EpExchange<'_, C>
where
    C::Tensor: 'static,
{
    fn size(&self) -> usize {
        self.group.size()
    }

    fn rank(&self) -> usize {
        self.group.position(self.comm.rank()).unwrap_or(0)
    }

    fn all_to_all(&mut self, send: Vec<Tensor>) -> Result<Vec<Tensor>, KernelError> {
        let err = |e: CommError| KernelError::Reduce(Box::new(e));
        let send = send
            .into_iter()
            .map(to_comm::<C::Tensor>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let got = self.comm.all_to_all(self.group, send).map_err(err)?;
        got.into_iter()
            .map(to_host)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)
    }
}

/// A flat tensor cut in two: the values outside `runs` (dense), and those inside (experts),
/// each flat, in order.
pub(crate) fn split(flat: &Tensor, runs: &[Range<usize>]) -> Result<(Tensor, Tensor), CommError> {
    let (mut dense, mut experts) = (Vec::new(), Vec::new());
    let mut at = 0;
    let data = flat.data();
    for r in runs {
        let r = checked(r, at, data.len())?;
        dense.extend_from_slice(&data[at..r.start]);
        experts.extend_from_slice(&data[r.clone()]);
        at = r.end;
    }
    dense.extend_from_slice(&data[at..]);
    Ok((flat_tensor(dense)?, flat_tensor(experts)?))
}

/// The inverse of [`split`].
pub(crate) fn splice(
    dense: &Tensor,
    experts: &Tensor,
    runs: &[Range<usize>],
) -> Result<Tensor, CommError> {
    let numel = dense.numel() + experts.numel();
    let (d, e) = (dense.data(), experts.data());
    let (mut out, mut di, mut ei) = (Vec::with_capacity(numel), 0, 0);
    for r in runs {
        let r = checked(r, out.len(), numel)?;
        let gap = r.start - out.len();
        out.extend_from_slice(d.get(di..di + gap).ok_or_else(|| short("dense"))?);
        out.extend_from_slice(e.get(ei..ei + r.len()).ok_or_else(|| short("expert"))?);
        (di, ei) = (di + gap, ei + r.len());
    }
    out.extend_from_slice(d.get(di..).ok_or_else(|| short("dense"))?);
    flat_tensor(out)
}

/// One stage's whole flat parameters from every EP rank's (group order): the dense values
/// are the same on every rank (the first's are kept), and each run of experts is every
/// rank's run, in rank order, which is the mixture's experts in expert order.
pub(crate) fn merge_experts(
    parts: &[Tensor],
    runs: &[Range<usize>],
) -> Result<Vec<f32>, CommError> {
    let first = parts
        .first()
        .ok_or_else(|| short("expert-parallel"))?
        .data();
    let mut out = Vec::new();
    let mut at = 0;
    for r in runs {
        let r = checked(r, at, first.len())?;
        out.extend_from_slice(&first[at..r.start]);
        for p in parts {
            let run = p.data().get(r.clone()).ok_or_else(|| short("expert"))?;
            out.extend_from_slice(run);
        }
        at = r.end;
    }
    out.extend_from_slice(&first[at..]);
    Ok(out)
}

fn checked(r: &Range<usize>, at: usize, len: usize) -> Result<Range<usize>, CommError> {
    if r.start < at || r.end < r.start || r.end > len {
        return Err(CommError::Invalid(format!(
            "expert run {r:?} is out of order or outside {len} values (expert_ranges)"
        )));
    }
    Ok(r.clone())
}

fn short(what: &str) -> CommError {
    CommError::Invalid(format!("the {what} values do not fill the expert runs"))
}

fn flat_tensor(v: Vec<f32>) -> Result<Tensor, CommError> {
    Tensor::new(&[v.len()], v).map_err(|e| CommError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_splice_are_inverse_and_merge_orders_experts_by_rank() {
        let flat = flat_tensor((0..10).map(|v| v as f32).collect()).unwrap();
        let runs = [2..4, 6..9];
        let (d, e) = split(&flat, &runs).unwrap();
        assert_eq!(d.data(), [0.0, 1.0, 4.0, 5.0, 9.0]);
        assert_eq!(e.data(), [2.0, 3.0, 6.0, 7.0, 8.0]);
        assert_eq!(splice(&d, &e, &runs).unwrap().data(), flat.data());
        let other = flat_tensor((0..10).map(|v| 100.0 + v as f32).collect()).unwrap();
        let merged = merge_experts(&[flat, other], &runs).unwrap();
        assert_eq!(merged[..6], [0.0, 1.0, 2.0, 3.0, 102.0, 103.0]);
        assert_eq!(merged[8..], [6.0, 7.0, 8.0, 106.0, 107.0, 108.0, 9.0]);
    }
}
