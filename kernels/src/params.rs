//! A module's parameters on any [`Backend`]: what a runtime needs between
//! backward passes and the optimizer step without leaving the device.
//!
//! The host-only flat views of [`Parameters`] (`flat_grads`,
//! `set_flat_grads`, ...) copy through host memory; these work on the
//! backend's own tensors, in the same visit order, so the flat layout is
//! the same on every backend: a data-parallel all-reduce sends one flat
//! gradient tensor per stage whichever device holds it.

use crate::backend::{Backend, Shaped};
use crate::error::{shape_err, Result};
use crate::footprint::Footprint;
use crate::layers::{Param, Parameters};

/// Keeps the first error of a visit (the visitor closures cannot return one).
fn first_err(slot: &mut Option<crate::KernelError>, r: Result<()>) {
    if let (None, Err(e)) = (&slot, r) {
        *slot = Some(e);
    }
}

fn done(slot: Option<crate::KernelError>) -> Result<()> {
    slot.map_or(Ok(()), Err)
}

/// Bytes of `m`'s parameter values and of its gradients, as their storage holds them (for
/// memory reports: the runtime's measured parameters and gradients).
pub fn storage_bytes<S: Shaped + Footprint, P: Parameters<S> + ?Sized>(m: &P) -> (usize, usize) {
    let (mut values, mut grads) = (0, 0);
    m.visit(&mut |p| {
        values += p.value.bytes();
        grads += p.grad.bytes();
    });
    (values, grads)
}

/// All gradients of `m`, concatenated in visit order into one flat `[n]`
/// tensor on `be` (a device-side copy).
pub fn flat_grads<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &P,
) -> Result<B::Storage> {
    let mut flat = be.zeros(&[m.num_params()])?;
    let (mut off, mut err) = (0, None);
    m.visit(&mut |p| {
        first_err(&mut err, be.copy_to_offset(&p.grad, &mut flat, off));
        off += p.grad.numel();
    });
    done(err).map(|()| flat)
}

/// Overwrites every gradient of `m` from a flat tensor laid out as
/// [`flat_grads`] makes it (e.g. after the all-reduce); errors on a length
/// mismatch.
pub fn set_flat_grads<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &mut P,
    flat: &B::Storage,
) -> Result<()> {
    set_flat(be, m, flat, "set_flat_grads", |p| &mut p.grad)
}

/// Overwrites every parameter value of `m` from a flat tensor in visit order (e.g. after
/// the ZeRO-1 all-gather of updated shards); errors on a length mismatch.
pub fn set_flat_params<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &mut P,
    flat: &B::Storage,
) -> Result<()> {
    set_flat(be, m, flat, "set_flat_params", |p| &mut p.value)
}

/// Overwrites one tensor of every parameter (`pick`: its value or its gradient) from a
/// flat tensor in visit order; errors (named `op`) on a length mismatch.
fn set_flat<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &mut P,
    flat: &B::Storage,
    op: &'static str,
    pick: fn(&mut Param<B::Storage>) -> &mut B::Storage,
) -> Result<()> {
    let n = m.num_params();
    if flat.numel() != n {
        return Err(shape_err(
            op,
            format!("{} values for {n} parameters", flat.numel()),
        ));
    }
    let (mut off, mut err) = (0, None);
    m.visit_mut(&mut |p| {
        let dst = pick(p);
        first_err(&mut err, be.copy_from_offset(flat, off, dst));
        off += dst.numel();
    });
    done(err)
}

/// Sets every gradient of `m` to zero, on the device.
pub fn zero_grads<B: Backend, P: Parameters<B::Storage> + ?Sized>(be: &B, m: &mut P) -> Result<()> {
    let mut err = None;
    m.visit_mut(&mut |p| first_err(&mut err, be.fill_zero(&mut p.grad)));
    done(err)
}

/// All values of `m` concatenated in visit order, copied to the host (for
/// checks and checkpoints; waits for pending device work).
pub fn flat_params_host<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &P,
) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(m.num_params());
    let mut err = None;
    m.visit(&mut |p| match be.download(&p.value) {
        Ok(t) => out.extend_from_slice(t.data()),
        Err(e) => first_err(&mut err, Err(e)),
    });
    done(err).map(|()| out)
}

/// All gradients of `m` concatenated in visit order, copied to the host.
pub fn flat_grads_host<B: Backend, P: Parameters<B::Storage> + ?Sized>(
    be: &B,
    m: &P,
) -> Result<Vec<f32>> {
    be.download(&flat_grads(be, m)?).map(|t| t.into_data())
}
