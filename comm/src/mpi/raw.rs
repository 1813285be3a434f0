//! The few non-blocking MPI calls the transport needs, over buffers it owns.
//!
//! rsmpi ties a request to the lifetime of its buffers through scopes, which suits code that
//! waits in the same function; the executor instead starts a send or a collective in one
//! action and finishes it several actions later. So a [`Flight`] owns its buffers (a `Vec`'s
//! heap block does not move when the `Vec` does) together with the raw request, and never
//! frees them while MPI may still touch them: a flight dropped unfinished leaks its buffers.
//! Every call returns MPI's error code as a [`CommError`] (the communicators are set to
//! `MPI_ERRORS_RETURN`, so a failed call reports instead of aborting the process).

use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};

use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;

use crate::CommError;

/// A started non-blocking operation and the buffers it uses.
pub(crate) struct Flight<B> {
    req: ffi::MPI_Request,
    bufs: Option<B>,
    done: bool,
}

impl<B> Flight<B> {
    /// Whether the operation has finished (drives MPI's progress).
    pub(crate) fn test(&mut self) -> Result<bool, CommError> {
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        // SAFETY: `req` is a live request started by this module; MPI_Test sets it to
        // MPI_REQUEST_NULL when it completes, which is never tested again (`done`).
        let rc = unsafe { ffi::MPI_Test(&mut self.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check(rc, "MPI_Test")?;
        self.done = flag != 0;
        Ok(self.done)
    }

    /// The buffers of a finished operation.
    pub(crate) fn into_bufs(mut self) -> Result<B, CommError> {
        if !self.test()? {
            return Err(CommError::Invalid("MPI operation not finished".into()));
        }
        self.bufs
            .take()
            .ok_or_else(|| CommError::Invalid("MPI buffers already taken".into()))
    }
}

impl<B> Drop for Flight<B> {
    fn drop(&mut self) {
        // An unfinished operation may still read or write the buffers (or MPI is gone and
        // cannot be asked): leak them rather than free memory MPI may touch.
        let finished = !mpi::environment::is_finalized() && self.test().unwrap_or(false);
        if !finished {
            std::mem::forget(self.bufs.take());
        }
    }
}

pub(crate) fn check(rc: c_int, what: &str) -> Result<(), CommError> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(CommError::Invalid(format!(
            "{what} failed with MPI error {rc}"
        )))
    }
}

fn count(n: usize, what: &str) -> Result<c_int, CommError> {
    c_int::try_from(n).map_err(|_| {
        CommError::Invalid(format!(
            "{what}: {n} elements is too many for one MPI message"
        ))
    })
}

fn datatype<T: Equivalence>() -> ffi::MPI_Datatype {
    T::equivalent_datatype().as_raw()
}

/// `MPI_Isend` of an owned buffer.
pub(crate) fn isend<T: Equivalence>(
    comm: ffi::MPI_Comm,
    data: Vec<T>,
    dst: c_int,
    tag: c_int,
) -> Result<Flight<Vec<T>>, CommError> {
    let n = count(data.len(), "send")?;
    let mut req = MaybeUninit::uninit();
    // SAFETY: the buffer is owned by the returned flight and outlives the request.
    let rc = unsafe {
        ffi::MPI_Isend(
            data.as_ptr().cast::<c_void>(),
            n,
            datatype::<T>(),
            dst,
            tag,
            comm,
            req.as_mut_ptr(),
        )
    };
    check(rc, "MPI_Isend")?;
    // SAFETY: MPI_Isend succeeded, so it wrote the request.
    let req = unsafe { req.assume_init() };
    Ok(Flight {
        req,
        bufs: Some(data),
        done: false,
    })
}

/// A message matched by [`improbe`]: only this handle can receive it.
pub(crate) struct Matched {
    msg: ffi::MPI_Message,
    /// Its size in bytes.
    bytes: usize,
    /// Its sender and tag.
    pub(crate) src: c_int,
    pub(crate) tag: c_int,
}

/// `MPI_Improbe` for one message from `src` with `tag` (either may be a wildcard).
pub(crate) fn improbe(
    comm: ffi::MPI_Comm,
    src: c_int,
    tag: c_int,
) -> Result<Option<Matched>, CommError> {
    let mut flag: c_int = 0;
    let mut msg = MaybeUninit::uninit();
    let mut status = MaybeUninit::<ffi::MPI_Status>::uninit();
    // SAFETY: out-pointers to live locals.
    let rc = unsafe {
        ffi::MPI_Improbe(
            src,
            tag,
            comm,
            &mut flag,
            msg.as_mut_ptr(),
            status.as_mut_ptr(),
        )
    };
    check(rc, "MPI_Improbe")?;
    if flag == 0 {
        return Ok(None);
    }
    // SAFETY: a successful match wrote the message handle and the status.
    let (msg, status) = unsafe { (msg.assume_init(), status.assume_init()) };
    let mut n: c_int = 0;
    // SAFETY: `status` is initialised.
    check(
        unsafe { ffi::MPI_Get_count(&status, datatype::<u8>(), &mut n) },
        "MPI_Get_count",
    )?;
    let bytes =
        usize::try_from(n).map_err(|_| CommError::Invalid(format!("a message of {n} bytes")))?;
    Ok(Some(Matched {
        msg,
        bytes,
        src: status.MPI_SOURCE,
        tag: status.MPI_TAG,
    }))
}

/// A receive buffer MPI fills: allocated, not initialised (zeroing 4 MiB first would cost
/// as much as a copy), and only read once the receive has finished.
pub(crate) struct RecvBuf<T> {
    buf: Vec<T>,
    len: usize,
}

impl<T: Copy> RecvBuf<T> {
    /// The received values. Only reachable through [`Flight::into_bufs`], that is after the
    /// receive finished.
    pub(crate) fn into_vec(mut self) -> Vec<T> {
        // SAFETY: the finished MPI_Imrecv wrote all `len` elements (the matched message's
        // exact size, within capacity), and `T: Copy` has no drop to worry about.
        unsafe { self.buf.set_len(self.len) };
        self.buf
    }
}

/// `MPI_Imrecv` of a matched message into a new buffer of its size.
pub(crate) fn imrecv<T: Equivalence + Copy>(m: Matched) -> Result<Flight<RecvBuf<T>>, CommError> {
    let size = std::mem::size_of::<T>();
    if m.bytes % size != 0 {
        return Err(CommError::Invalid(format!(
            "a message of {} bytes from rank {} is not whole {size}-byte values",
            m.bytes, m.src
        )));
    }
    let len = m.bytes / size;
    let mut buf = Vec::<T>::with_capacity(len);
    let n = count(len, "receive")?;
    let mut msg = m.msg;
    let mut req = MaybeUninit::uninit();
    // SAFETY: the buffer has room for the whole message and is owned by the flight.
    let rc = unsafe {
        ffi::MPI_Imrecv(
            buf.as_mut_ptr().cast::<c_void>(),
            n,
            datatype::<T>(),
            &mut msg,
            req.as_mut_ptr(),
        )
    };
    check(rc, "MPI_Imrecv")?;
    // SAFETY: MPI_Imrecv succeeded, so it wrote the request.
    let req = unsafe { req.assume_init() };
    Ok(Flight {
        req,
        bufs: Some(RecvBuf { buf, len }),
        done: false,
    })
}

/// An all-gather in flight: (what this rank sent, every rank's part in rank order).
pub(crate) type Gathered<T> = Flight<(Vec<T>, Vec<T>)>;

/// `MPI_Iallgather` of equal-sized buffers: the result holds every rank's `send` in rank order.
pub(crate) fn iallgather<T: Equivalence + Default + Clone>(
    comm: ffi::MPI_Comm,
    send: Vec<T>,
    ranks: usize,
) -> Result<Gathered<T>, CommError> {
    let n = count(send.len(), "all-gather")?;
    count(send.len() * ranks, "all-gather")?;
    let recv = vec![T::default(); send.len() * ranks];
    // SAFETY: `recv` holds `ranks` blocks of `n`, as MPI_Iallgather writes.
    unsafe { blocks(comm, send, recv, n, ffi::MPI_Iallgather, "MPI_Iallgather") }
}

/// `MPI_Ialltoall` of `ranks` equal blocks: block `i` of `send` goes to rank `i`, and block
/// `i` of the result came from rank `i` (the result is in the flight's second buffer).
pub(crate) fn ialltoall<T: Equivalence + Default + Clone>(
    comm: ffi::MPI_Comm,
    send: Vec<T>,
    ranks: usize,
) -> Result<Gathered<T>, CommError> {
    if ranks == 0 || send.len() % ranks != 0 {
        return Err(CommError::Invalid(format!(
            "all-to-all of {} values over {ranks} ranks",
            send.len()
        )));
    }
    let n = count(send.len() / ranks, "all-to-all")?;
    count(send.len(), "all-to-all")?;
    let recv = vec![T::default(); send.len()];
    // SAFETY: `send` and `recv` hold `ranks` blocks of `n`, as MPI_Ialltoall reads and writes.
    unsafe { blocks(comm, send, recv, n, ffi::MPI_Ialltoall, "MPI_Ialltoall") }
}

/// The C signature MPI_Iallgather and MPI_Ialltoall share.
type BlockCollective = unsafe extern "C" fn(
    *const c_void,
    c_int,
    ffi::MPI_Datatype,
    *mut c_void,
    c_int,
    ffi::MPI_Datatype,
    ffi::MPI_Comm,
    *mut ffi::MPI_Request,
) -> c_int;

/// Start `call` with blocks of `n` values out of `send` and into `recv`, both then owned by
/// the flight.
///
/// # Safety
/// `send` and `recv` must be as long as `call` reads and writes for blocks of `n`.
unsafe fn blocks<T: Equivalence>(
    comm: ffi::MPI_Comm,
    send: Vec<T>,
    mut recv: Vec<T>,
    n: c_int,
    call: BlockCollective,
    name: &'static str,
) -> Result<Gathered<T>, CommError> {
    let mut req = MaybeUninit::uninit();
    let dt = datatype::<T>();
    // SAFETY: the caller vouches for the lengths; the flight keeps both buffers alive.
    let rc = unsafe {
        call(
            send.as_ptr().cast::<c_void>(),
            n,
            dt,
            recv.as_mut_ptr().cast::<c_void>(),
            n,
            dt,
            comm,
            req.as_mut_ptr(),
        )
    };
    check(rc, name)?;
    // SAFETY: the call succeeded, so it wrote the request.
    let req = unsafe { req.assume_init() };
    Ok(Flight {
        req,
        bufs: Some((send, recv)),
        done: false,
    })
}

/// `MPI_Ibarrier`.
pub(crate) fn ibarrier(comm: ffi::MPI_Comm) -> Result<Flight<()>, CommError> {
    let mut req = MaybeUninit::uninit();
    // SAFETY: out-pointer to a live local.
    check(
        unsafe { ffi::MPI_Ibarrier(comm, req.as_mut_ptr()) },
        "MPI_Ibarrier",
    )?;
    // SAFETY: MPI_Ibarrier succeeded, so it wrote the request.
    let req = unsafe { req.assume_init() };
    Ok(Flight {
        req,
        bufs: Some(()),
        done: false,
    })
}

/// Make MPI calls on `comm` (and communicators later derived from it) return errors instead
/// of aborting the job, so a lost peer becomes an error this process can report.
pub(crate) fn errors_return(comm: ffi::MPI_Comm) -> Result<(), CommError> {
    // SAFETY: `comm` is a live communicator; the handler is MPI's predefined one.
    check(
        unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) },
        "MPI_Comm_set_errhandler",
    )
}

/// The largest tag this MPI accepts (`MPI_TAG_UB`, at least 32767 by the standard).
pub(crate) fn tag_upper_bound(comm: ffi::MPI_Comm) -> c_int {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: for MPI_TAG_UB, MPI stores a pointer to an int in `value`.
    let rc = unsafe {
        ffi::MPI_Comm_get_attr(
            comm,
            ffi::MPI_TAG_UB as c_int,
            (&mut value as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        )
    };
    if rc != ffi::MPI_SUCCESS as c_int || flag == 0 || value.is_null() {
        return 32767;
    }
    // SAFETY: MPI returned a valid pointer to the attribute's int.
    unsafe { *value }
}
