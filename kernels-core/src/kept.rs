//! Kept tensors: how a stash holds an activation from a forward until its backward
//! ([`Backend::Kept`](crate::backend::Backend::Kept)).
//!
//! In an f32 or tf32 run a kept tensor is the f32 tensor itself, moved in and lent back
//! out, so keeping costs nothing and changes no bit. In a bf16 run it is stored as bf16,
//! 2 bytes an element, and widened to f32 when a backward reads it: the activation memory a
//! bf16 run exists to save. Per-row statistics and token ids are not kept this way: they are
//! small and precision-critical (as in PyTorch autocast and Megatron); nor are the loss's
//! softmax probabilities (autocast and Megatron keep them in f32) or the CPU's attention
//! probabilities (what a GPU's backward recomputes in f32).

use crate::float16::Bf16;

pub use crate::backend::Restored;
use crate::backend::Shaped;
use crate::error::Result;
use crate::footprint::Footprint;
use crate::precision::{Precision, PrecisionExt};
use crate::tensor::{DType, Tensor};

/// A tensor as a stash keeps it, on any backend: the f32 tensor `S` itself, or its values
/// rounded to bf16 in the backend's buffer `H` (round to nearest even) with its shape.
/// [`HostKept`] on the CPU; `cuda::CudaKept` on a GPU.
#[derive(Clone, Debug, PartialEq)]
pub enum Kept<S, H> {
    /// The f32 tensor itself (f32 and tf32 runs).
    F32(S),
    /// Its values rounded to bf16, with its shape (a device buffer may hold more elements
    /// than the shape's; the shape says how many are live).
    Bf16 {
        /// The dimensions.
        shape: Vec<usize>,
        /// The values, row-major.
        data: H,
    },
}

/// A host tensor as a stash keeps it: f32, or bf16 in a bf16 run.
pub type HostKept = Kept<Tensor, Vec<Bf16>>;

impl<S, H> Kept<S, H> {
    /// The storage format.
    pub fn dtype(&self) -> DType {
        match self {
            Kept::F32(_) => DType::F32,
            Kept::Bf16 { .. } => DType::BF16,
        }
    }
}

impl<S: Shaped, H> Shaped for Kept<S, H> {
    fn shape(&self) -> &[usize] {
        match self {
            Kept::F32(t) => t.shape(),
            Kept::Bf16 { shape, .. } => shape,
        }
    }
}

impl<S: Shaped, H> Footprint for Kept<S, H> {
    fn bytes(&self) -> usize {
        self.numel() * self.dtype().size()
    }
}

impl Kept<Tensor, Vec<Bf16>> {
    /// `t` kept in `precision`'s activation format ([`Precision::activation_dtype`]).
    pub fn new(t: Tensor, precision: Precision) -> Self {
        match precision.activation_dtype() {
            DType::BF16 => HostKept::Bf16 {
                data: t.to_bf16(),
                shape: t.shape().to_vec(),
            },
            _ => HostKept::F32(t),
        }
    }

    /// The kept values as f32: lent where they are f32, else widened (exactly: every bf16
    /// value is an f32 value).
    pub fn restore(&self) -> Result<Restored<'_, Tensor>> {
        match self {
            HostKept::F32(t) => Ok(Restored::Same(t)),
            HostKept::Bf16 { shape, data } => {
                Ok(Restored::Widened(Tensor::from_bf16(shape, data)?))
            }
        }
    }

    /// [`HostKept::restore`] by value: the tensor itself where it is f32.
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            HostKept::F32(t) => Ok(t),
            HostKept::Bf16 { shape, data } => Tensor::from_bf16(&shape, &data),
        }
    }
}

/// What the host backend's LayerNorm forward keeps for its backward: the normalised input
/// `x̂` kept like any activation and the per-row `1/σ` in f32.
#[derive(Clone, Debug, PartialEq)]
pub struct HostNormStash {
    /// `(x - mean) * rstd`, shape of `x`.
    pub xhat: HostKept,
    /// `1 / sqrt(var + eps)` per row.
    pub rstd: Vec<f32>,
}

impl Footprint for HostNormStash {
    fn bytes(&self) -> usize {
        self.xhat.bytes() + std::mem::size_of_val(self.rstd.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Tensor {
        let data = (0..12).map(|i| 0.1 + 1.0 / (1.0 + i as f32)).collect();
        Tensor::new(&[3, 4], data).unwrap()
    }

    #[test]
    fn f32_and_tf32_keep_the_tensor_itself_and_lend_it_back() {
        for p in [Precision::F32, Precision::Tf32] {
            let k = HostKept::new(sample(), p);
            assert_eq!(k.bytes(), 48, "{p}");
            let r = k.restore().unwrap();
            assert!(matches!(r, Restored::Same(_)), "{p}: no copy");
            assert_eq!(*r, sample(), "{p}");
        }
    }

    #[test]
    fn bf16_keeps_two_bytes_an_element_and_widens_to_the_rounded_values() {
        let k = HostKept::new(sample(), Precision::Bf16);
        assert_eq!(k.bytes(), 24);
        assert_eq!(k.shape(), &[3, 4]);
        let mut want = sample();
        Precision::Bf16.round_activation(want.data_mut());
        assert_ne!(want, sample(), "the sample has bits below bf16's");
        assert_eq!(*k.restore().unwrap(), want);
        // Keeping a bf16 value again is exact.
        let again = HostKept::new(k.restore().unwrap().clone(), Precision::Bf16);
        assert_eq!(again, k);
    }
}
