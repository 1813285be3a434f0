//! The CUDA-local transport (feature `cuda`): several pipeline ranks in one process sharing
//! one GPU, each rank an OS thread with its own stream ([`CudaBackend::on_new_stream`]).
//!
//! It is the in-process transport ([`LocalComm`]) with a device data plane, [`CudaOps`]:
//! the mailboxes, rounds, timeouts and abort are the ones the CPU tests exercise.
//! - A send records an event on the sender's stream and hands the tensor over; the receiver's
//!   stream waits for that event and copies the tensor into a buffer of its own; the source
//!   is freed once the copy's event has completed. Nothing blocks the host. In a bf16 run a
//!   pipeline payload travels in the backend's kept form (bf16, half the bytes: its values
//!   are bf16 already, the residual stream being rounded, so nothing changes) and the
//!   receiver's copy is the widening back to f32; the message says its format, so the two
//!   ends cannot disagree. Collectives always carry f32 (gradients are summed in f32).
//! - Collectives: each rank's stream waits for every part's event and sums the parts in
//!   group order with the backend's add kernel, so every rank gets the same bits, and the CPU
//!   transports' bits too (an f32 add is exact-rounded on either side). The collecting rank
//!   then waits for its stream: parts are freed by whichever rank collects last, and no
//!   other rank may still be reading them. That host wait is the price of simplicity here;
//!   this transport exists to exercise the GPU path on one GPU, not for speed.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use pipewright_kernels::cuda::interop::{CudaEvent, CudaStream};
use pipewright_kernels::cuda::{CudaBackend, CudaKept, CudaTensor};
use pipewright_kernels::kept::Restored;
use pipewright_kernels::{Backend, Tensor};

use super::local::{LocalComm, LocalOps, LocalWorld};
use super::{check_shard, shard_range, CommError, ReduceOp};

/// A world of CUDA-local ranks.
pub type CudaLocalWorld = LocalWorld<CudaMessage>;
/// One CUDA-local rank's communicator.
pub type CudaLocalComm = LocalComm<CudaOps>;

/// A device tensor in transit, with the event recorded on its producer's stream after the
/// work that wrote it: f32, or a pipeline payload in a bf16 run's kept form.
pub struct CudaMessage {
    payload: CudaKept,
    ready: CudaEvent,
}

impl CudaMessage {
    /// The f32 tensor of a collective's part (collectives never narrow).
    fn tensor(&self) -> Result<&CudaTensor, CommError> {
        match &self.payload {
            CudaKept::F32(t) => Ok(t),
            CudaKept::Bf16 { .. } => Err(CommError::Invalid(
                "a bf16 pipeline payload where a collective's f32 part was expected".into(),
            )),
        }
    }
}

/// One rank's device data plane: its backend, whose stream orders all of the rank's work.
pub struct CudaOps {
    backend: Arc<CudaBackend>,
    /// Received messages whose copy may still be running, with the event after it. Freeing
    /// a source earlier would make its sender's stream wait for this rank's copy (cudarc
    /// orders a free after the slice's last use), coupling the two ranks' streams.
    copied: RefCell<VecDeque<(CudaMessage, CudaEvent)>>,
}

fn device_err(e: impl std::fmt::Debug) -> CommError {
    CommError::Device(format!("{e:?}"))
}

impl CudaOps {
    /// The data plane of a rank computing on `backend` (give every rank its own stream).
    pub fn new(backend: Arc<CudaBackend>) -> Self {
        CudaOps {
            backend,
            copied: RefCell::default(),
        }
    }

    /// The rank's backend, to build its stage modules on the same stream.
    pub fn backend(&self) -> &Arc<CudaBackend> {
        &self.backend
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.backend.stream()
    }

    /// `t` with an event after everything queued so far on this rank's stream.
    fn message(&self, payload: CudaKept) -> Result<CudaMessage, CommError> {
        let ready = self.stream().record_event(None).map_err(device_err)?;
        Ok(CudaMessage { payload, ready })
    }

    /// Order this rank's stream after the producer of `m`.
    fn wait_for(&self, m: &CudaMessage) -> Result<(), CommError> {
        self.stream().wait(&m.ready).map_err(device_err)
    }

    /// A copy of `src` in a buffer allocated on this rank's stream.
    fn copy(&self, src: &CudaTensor) -> Result<CudaTensor, CommError> {
        let data = self.stream().clone_dtod(src.slice()).map_err(device_err)?;
        CudaTensor::from_slice(src.shape(), data).map_err(device_err)
    }

    /// Wait (on the host) until this rank's stream has done everything queued, so parts read
    /// by it can be freed by another rank.
    fn settle(&self) -> Result<(), CommError> {
        self.stream().synchronize().map_err(device_err)
    }

    /// `parts` summed in order on this rank's stream.
    fn sum(&self, parts: &[&CudaMessage]) -> Result<CudaTensor, CommError> {
        let (first, rest) = parts
            .split_first()
            .ok_or_else(|| CommError::Invalid("empty group".into()))?;
        parts.iter().try_for_each(|p| self.wait_for(p))?;
        let mut acc = self.copy(first.tensor()?)?;
        for p in rest {
            acc = self
                .backend
                .add(&acc, p.tensor()?)
                .map_err(|e| CommError::Invalid(format!("all-reduce: {e}")))?;
        }
        Ok(acc)
    }

    /// The mean from the sum, scaled on the host exactly as `reduce_in_order` does (the
    /// runtime reduces gradients with `Sum`; this keeps `Mean` correct, not fast).
    fn mean(&self, sum: CudaTensor, n: usize) -> Result<CudaTensor, CommError> {
        let mut host: Tensor = self.backend.download(&sum).map_err(device_err)?;
        host.scale(1.0 / n as f32);
        self.backend.upload(&host).map_err(device_err)
    }
}

impl LocalOps for CudaOps {
    type Tensor = CudaTensor;
    type Message = CudaMessage;

    fn outgoing(&self, t: CudaTensor) -> Result<CudaMessage, CommError> {
        self.message(CudaKept::F32(t))
    }

    fn hand_off(&self, t: CudaTensor) -> Result<CudaMessage, CommError> {
        // The conversion is queued on this stream, before the message's event.
        let kept = self.backend.keep(t).map_err(device_err)?;
        self.message(kept)
    }

    fn incoming(&self, m: CudaMessage) -> Result<CudaTensor, CommError> {
        self.wait_for(&m)?;
        let mine = match self.backend.restore(&m.payload).map_err(device_err)? {
            Restored::Same(t) => self.copy(t)?,
            Restored::Widened(t) => t,
        };
        let done = self.stream().record_event(None).map_err(device_err)?;
        let mut copied = self.copied.borrow_mut();
        copied.push_back((m, done));
        // Free the sources whose copies have finished (in order: one stream did them).
        while let Some((_, done)) = copied.front() {
            if !done.try_is_complete().map_err(device_err)? {
                break;
            }
            copied.pop_front();
        }
        Ok(mine)
    }

    fn duplicate(&self, t: &CudaTensor) -> Result<CudaMessage, CommError> {
        let copy = self.copy(t)?;
        self.message(CudaKept::F32(copy))
    }

    fn reduce(&self, parts: &[&CudaMessage], op: ReduceOp) -> Result<CudaTensor, CommError> {
        let out = self.sum(parts).and_then(|sum| match op {
            ReduceOp::Sum => Ok(sum),
            ReduceOp::Mean => self.mean(sum, parts.len()),
        });
        // Settle on failure too: reads of the parts queued before it may still be running.
        self.settle()?;
        out
    }

    fn gather(&self, parts: &[&CudaMessage]) -> Result<Vec<CudaTensor>, CommError> {
        let out = parts
            .iter()
            .map(|p| {
                self.wait_for(p)?;
                self.copy(p.tensor()?)
            })
            .collect::<Result<Vec<_>, _>>();
        self.settle()?; // on failure too, as in `reduce`
        out
    }

    fn share(&self, whole: &CudaTensor, pos: usize, n: usize) -> Result<CudaTensor, CommError> {
        let r = shard_range(whole.numel(), n, pos);
        if r.is_empty() {
            return self.placeholder();
        }
        let len = r.len();
        let view = whole.slice().slice(r);
        let data = self.stream().clone_dtod(&view).map_err(device_err)?;
        CudaTensor::from_slice(&[len], data).map_err(device_err)
    }

    fn concat(&self, parts: &[&CudaMessage], numel: usize) -> Result<CudaTensor, CommError> {
        let out = self
            .backend
            .zeros(&[numel])
            .map_err(device_err)
            .and_then(|mut out| {
                let mut off = 0;
                for (pos, p) in parts.iter().enumerate() {
                    let part = p.tensor()?;
                    check_shard(part.numel(), numel, parts.len(), pos)?;
                    self.wait_for(p)?;
                    if part.numel() > 0 {
                        self.backend
                            .copy_to_offset(part, &mut out, off)
                            .map_err(device_err)?;
                    }
                    off += part.numel();
                }
                Ok(out)
            });
        self.settle()?; // on failure too, as in `reduce`
        out
    }

    fn numel(&self, t: &CudaTensor) -> usize {
        t.numel()
    }

    fn placeholder(&self) -> Result<CudaTensor, CommError> {
        self.backend.zeros(&[0]).map_err(device_err)
    }
}
