//! Bytes held: what a stash keeps alive, for the runtime's stash peaks and the
//! recomputation trade-off. Counted from tensor storage (f32 or, for kept tensors in a
//! bf16 run, bf16 elements; per-row vectors, token ids), so the figure is the memory
//! actually kept, not an estimate.

use crate::tensor::Tensor;

/// Bytes of storage a value keeps alive.
pub trait Footprint {
    /// Bytes held.
    fn bytes(&self) -> usize;
}

/// Bytes of one f32 element.
pub const F32: usize = std::mem::size_of::<f32>();

impl Footprint for Tensor {
    fn bytes(&self) -> usize {
        self.data().len() * F32
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

impl<T: Footprint + ?Sized> Footprint for Box<T> {
    fn bytes(&self) -> usize {
        (**self).bytes()
    }
}

impl<T: Footprint, const N: usize> Footprint for [T; N] {
    fn bytes(&self) -> usize {
        self.iter().map(Footprint::bytes).sum()
    }
}

/// Tuples (up to six) hold the sum of their parts.
macro_rules! tuples {
    ($(($($t:ident . $i:tt),+)),* $(,)?) => {$(
        impl<$($t: Footprint),+> Footprint for ($($t,)+) {
            fn bytes(&self) -> usize {
                0 $(+ self.$i.bytes())+
            }
        }
    )*};
}

tuples!(
    (A.0),
    (A.0, B.1),
    (A.0, B.1, C.2),
    (A.0, B.1, C.2, D.3),
    (A.0, B.1, C.2, D.3, E.4),
    (A.0, B.1, C.2, D.3, E.4, F.5),
);

/// Nothing kept (a stage or layer whose backward needs nothing).
impl Footprint for () {
    fn bytes(&self) -> usize {
        0
    }
}

/// Plain values (row statistics, token ids, flags, scalars) hold their size.
macro_rules! plain {
    ($($t:ty),*) => {$(
        impl Footprint for $t {
            fn bytes(&self) -> usize {
                std::mem::size_of::<$t>()
            }
        }
    )*};
}

plain!(bool, u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::LayerNormStash;

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
        // A layer's own pair of a norm stash and a tensor counts both, as do triples.
        assert_eq!((s.clone(), Tensor::zeros(&[2])).bytes(), 80);
        assert_eq!((1.0f32, vec![0.5f64; 3], ()).bytes(), 28);
    }
}
