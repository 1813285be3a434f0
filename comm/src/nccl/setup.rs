//! Building a rank's NCCL communicators: every group and link end it is in, in the plan's
//! global order, from ids shared through a rendezvous.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use cudarc::nccl::{Comm, Id};
use pipewright_kernels::cuda::CudaBackend;
use pipewright_schedule::Timetable;

use super::{device_err, missing_library, nccl_err, LinkEnd, NcclComm};
use crate::links::{check_link_order, nccl_plan, CommRole};
use crate::mesh::Mesh;
use crate::rendezvous::{IdBytes, Rendezvous};
use crate::CommError;

/// What [`NcclComm::new`] needs.
pub struct NcclSetup<'a> {
    /// The mesh.
    pub mesh: Mesh,
    /// The lowered timetable (its links and their order).
    pub tt: &'a Timetable,
    /// This process's rank in the mesh.
    pub rank: usize,
    /// The rank's GPU; its stream is the compute stream the transport orders against.
    pub backend: Arc<CudaBackend>,
    /// Longest wait for a message, a collective or an id.
    pub timeout: Duration,
}

impl NcclComm {
    /// Check the libraries and the timetable's link order, then create every communicator
    /// this rank is in, in the plan's global order, with ids from `rendezvous`.
    pub fn new(setup: NcclSetup<'_>, rendezvous: &mut dyn Rendezvous) -> Result<Self, CommError> {
        if let Some(why) = missing_library() {
            return Err(CommError::Device(why));
        }
        check_link_order(setup.tt).map_err(|e| CommError::Invalid(e.to_string()))?;
        let ctx = Arc::clone(setup.backend.context());
        let comm = NcclComm {
            rank: setup.rank,
            size: setup.mesh.world_size(),
            staging: ctx.new_stream().map_err(device_err)?,
            backend: setup.backend,
            groups: RefCell::default(),
            outgoing: RefCell::default(),
            incoming: RefCell::default(),
            timeout: setup.timeout,
            aborted: RefCell::default(),
        };
        let mut headers: HashMap<usize, Comm> = HashMap::new();
        for spec in nccl_plan(&setup.mesh, setup.tt) {
            let Some(id) = rendezvous.share(&spec, setup.rank, &mut new_id)? else {
                continue;
            };
            // Checked before any NCCL call: a link's other end exists only on links.
            let member = spec
                .membership(setup.rank)
                .map_err(|e| CommError::Invalid(e.to_string()))?;
            let stream = ctx.new_stream().map_err(device_err)?;
            let nccl = Comm::from_rank(stream, member.position, spec.ranks.len(), id_from(id))
                .map_err(nccl_err)?;
            match (spec.role, member.link_end) {
                (CommRole::Group(kind, index), _) => {
                    comm.groups
                        .borrow_mut()
                        .insert((kind, index), Rc::new(nccl));
                }
                (CommRole::Headers(_), Some((_, other))) => {
                    headers.insert(other, nccl);
                }
                (CommRole::Payloads(_), Some((sending, other))) => {
                    let h = headers.remove(&other).ok_or_else(|| {
                        CommError::Invalid(format!("{}: its headers are missing", spec.name))
                    })?;
                    comm.add_link(sending, other, h, nccl);
                }
                (_, None) => {
                    return Err(CommError::Invalid(format!(
                        "{}: a link without another end",
                        spec.name
                    )))
                }
            }
        }
        Ok(comm)
    }

    fn add_link(&self, sending: bool, other: usize, headers: Comm, payloads: Comm) {
        let end = Rc::new(LinkEnd {
            peer: i32::from(sending),
            headers,
            payloads,
            posted: Cell::new(0),
            taken: Cell::new(0),
            in_flight: RefCell::default(),
        });
        let map = if sending {
            &self.outgoing
        } else {
            &self.incoming
        };
        map.borrow_mut().insert(other, end);
    }
}

fn new_id() -> Result<IdBytes, CommError> {
    let id = Id::new().map_err(nccl_err)?;
    Ok(id.internal().map(|c| c as u8))
}

fn id_from(bytes: IdBytes) -> Id {
    Id::uninit(bytes.map(|b| b as std::ffi::c_char))
}
