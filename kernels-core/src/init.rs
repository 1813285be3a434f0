//! Deterministic initialisation: a small self-contained PRNG and per-tensor
//! seeds derived from `(model seed, parameter name)`.
//!
//! Because each full tensor has its own stream, a model built whole and the
//! same model built as any set of pipeline stages or TP shards draw the very
//! same numbers: every rank generates the full tensor, then keeps its shard.

use crate::tensor::Tensor;

/// SplitMix64: tiny, fast, statistically fine for initialisation, and
/// identical on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]` (never 0, so its log is finite).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal by Box-Muller (one value per call, for simplicity).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Uniform integer in `0..n` (`n > 0`; modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The seed of the tensor called `name` in a model seeded with `seed`
/// (FNV-1a of the name, mixed with the seed).
pub fn derive_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    Rng::new(seed ^ h.rotate_left(17)).next_u64()
}

/// A tensor of normal values with standard deviation `std`, drawn from the
/// stream of `(seed, name)`.
pub fn normal_tensor(shape: &[usize], std: f32, seed: u64, name: &str) -> Tensor {
    let mut rng = Rng::new(derive_seed(seed, name));
    let n = shape.iter().product();
    let data = (0..n).map(|_| (rng.normal() * std as f64) as f32).collect();
    Tensor::from_parts(shape.to_vec(), data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a = normal_tensor(&[1000], 1.0, 7, "w");
        assert_eq!(a, normal_tensor(&[1000], 1.0, 7, "w"));
        assert_ne!(a, normal_tensor(&[1000], 1.0, 7, "v"));
        assert_ne!(a, normal_tensor(&[1000], 1.0, 8, "w"));
        let mean = a.data().iter().sum::<f32>() / 1000.0;
        let var = a.data().iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "{mean} {var}");
    }
}
