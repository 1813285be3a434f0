//! One end of a directed pipeline link: its header and payload communicators, how many
//! receives it has posted, and what its sends in flight still read.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use cudarc::nccl::Comm;
use pipewright_kernels::cuda::CudaKept;

use super::device_err;
use crate::CommError;

/// Something a send reads, kept alive until the send's event completes.
pub(super) enum Keep {
    Header(#[allow(dead_code)] CudaSlice<u64>),
    Payload(#[allow(dead_code)] CudaKept),
}

/// One end of a directed pipeline link between two ranks.
pub(super) struct LinkEnd {
    /// The other end's NCCL rank in both communicators (the sender is 0, the receiver 1).
    pub(super) peer: i32,
    pub(super) headers: Comm,
    pub(super) payloads: Comm,
    /// Receiving end: header receives posted, and payload receives posted, so far.
    pub(super) posted: Cell<u64>,
    pub(super) taken: Cell<u64>,
    /// Sending end: what sends in flight read.
    pub(super) in_flight: RefCell<VecDeque<(Keep, CudaEvent)>>,
}

impl LinkEnd {
    /// Free what finished sends no longer read.
    pub(super) fn reap(&self) -> Result<(), CommError> {
        let mut q = self.in_flight.borrow_mut();
        while let Some((_, done)) = q.front() {
            if !done.try_is_complete().map_err(device_err)? {
                break;
            }
            q.pop_front();
        }
        Ok(())
    }

    pub(super) fn keep(&self, what: Keep, stream: &CudaStream) -> Result<(), CommError> {
        let done = stream.record_event(None).map_err(device_err)?;
        self.in_flight.borrow_mut().push_back((what, done));
        Ok(())
    }
}
