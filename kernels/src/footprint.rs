//! Bytes held: what a stash keeps alive, for the runtime's stash peaks and the
//! recomputation trade-off. Counted from tensor storage (f32 or, for kept tensors in a
//! bf16 run, bf16 elements; per-row vectors, token ids), so the figure is the memory
//! actually kept, not an estimate.

use crate::cpu::LayerNormStash;
use crate::tensor::Tensor;

/// Bytes of storage a value keeps alive.
pub trait Footprint {
    /// Bytes held.
    fn bytes(&self) -> usize;
}

const F32: usize = std::mem::size_of::<f32>();

impl Footprint for Tensor {
    fn bytes(&self) -> usize {
        self.data().len() * F32
    }
}

impl Footprint for LayerNormStash {
    fn bytes(&self) -> usize {
        self.xhat.bytes() + self.rstd.len() * F32
    }
}

impl<T: Footprint> Footprint for Option<T> {
    fn bytes(&self) -> usize {
        self.as_ref().map_or(0, Footprint::bytes)
    }
}

impl<T: Footprint> Footprint for Vec<T> {
    fn bytes(&self) -> usize {
        self.iter().map(Footprint::bytes).sum()
    }
}

impl<A: Footprint, B: Footprint> Footprint for (A, B) {
    fn bytes(&self) -> usize {
        self.0.bytes() + self.1.bytes()
    }
}

impl Footprint for u32 {
    fn bytes(&self) -> usize {
        std::mem::size_of::<u32>()
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Footprint, F32};
    use crate::cuda::{CudaAttnStash, CudaNormStash, CudaTensor};

    impl Footprint for CudaTensor {
        fn bytes(&self) -> usize {
            self.numel() * F32
        }
    }

    impl Footprint for CudaNormStash {
        fn bytes(&self) -> usize {
            self.xhat.bytes() + self.rstd.bytes()
        }
    }

    impl Footprint for CudaAttnStash {
        fn bytes(&self) -> usize {
            self.lse.bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_holds_four_bytes_per_element_and_a_norm_stash_adds_its_rows() {
        let t = Tensor::zeros(&[3, 5]);
        assert_eq!(t.bytes(), 60);
        let s = LayerNormStash {
            xhat: t,
            rstd: vec![0.0; 3],
        };
        assert_eq!(s.bytes(), 72);
        assert_eq!(Some(vec![1u32, 2]).bytes(), 8);
    }
}
