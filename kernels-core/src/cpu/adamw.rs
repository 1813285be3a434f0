//! The host backend's AdamW: one update of one parameter tensor on host slices, the
//! arithmetic [`Backend::adamw_step`](crate::Backend::adamw_step) runs on [`super::Cpu`]
//! (the GPU's kernel repeats it statement for statement in `kernels-cuda/src/kernels.rs`).

use crate::backend::AdamWUpdate;

/// The AdamW update on host slices of one length; the one definition both
/// `pipewright_kernels::optim::AdamW` and the CPU backend use, so they agree to the bit.
pub fn adamw_update(x: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWUpdate) {
    let state = m.iter_mut().zip(v.iter_mut());
    for ((x, &g), (m, v)) in x.iter_mut().zip(g).zip(state) {
        *m = h.beta1 * *m + (1.0 - h.beta1) * g;
        *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
        *x *= h.shrink;
        *x -= h.lr * (*m / h.bc1) / ((*v / h.bc2).sqrt() + h.eps);
    }
}
