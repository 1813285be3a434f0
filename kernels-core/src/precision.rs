//! Numeric precision of a backend's work: what its matmuls read and what its
//! activations are stored as. Master weights, gradients and optimizer moments are f32 in
//! every precision.
//!
//! The host backend emulates the reduced formats by rounding f32 values to them (the values
//! stay in f32 storage), so a bf16 run on the CPU computes what a GPU computes with bf16
//! inputs and f32 accumulation, up to the order of the sums.

use crate::float16::Bf16;

use crate::tensor::DType;

/// How a backend computes: the format of matmul inputs and of stored activations. Defined
/// once in `pipewright-kinds` (names, parsing, `activation_bytes`); what it means to a
/// backend is [`PrecisionExt`].
pub use pipewright_kinds::Precision;

/// What a [`Precision`] means to a backend's values (kernel-only, so not in
/// `pipewright-kinds`).
pub trait PrecisionExt {
    /// The format stored activations and pipeline hand-offs take: bf16 in a bf16 run,
    /// else f32 (TF32 only changes what a matmul reads).
    fn activation_dtype(self) -> DType;
    /// Rounds `x` in place to what a matmul in this precision reads.
    fn round_matmul_input(self, x: &mut [f32]);
    /// Rounds `x` in place to the stored-activation format ([`Self::activation_dtype`]).
    fn round_activation(self, x: &mut [f32]);
}

impl PrecisionExt for Precision {
    fn activation_dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
            Precision::F32 | Precision::Tf32 => DType::F32,
        }
    }

    fn round_matmul_input(self, x: &mut [f32]) {
        match self {
            Precision::F32 => {}
            Precision::Tf32 => x.iter_mut().for_each(|v| *v = round_tf32(*v)),
            Precision::Bf16 => round_bf16(x),
        }
    }

    fn round_activation(self, x: &mut [f32]) {
        if self == Precision::Bf16 {
            round_bf16(x);
        }
    }
}

/// Rounds to bf16 (round-to-nearest-even, as `half` and the GPU's conversion do) and back.
fn round_bf16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = Bf16::from_f32(*v).to_f32());
}

/// Rounds an f32 to TF32's 10 mantissa bits, to nearest, ties to even; infinities and NaN
/// pass through (a NaN keeps its payload's top bits, so it stays a NaN).
pub fn round_tf32(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    const DROP: u32 = 13; // 23 - 10 mantissa bits
    let bits = v.to_bits();
    let half = 1u32 << (DROP - 1);
    let odd = (bits >> DROP) & 1;
    // Adding below the kept bits carries into them (and into the exponent on overflow of
    // the mantissa, which is the correct rounding up, up to infinity).
    let rounded = bits.wrapping_add(half - 1 + odd) & !((1u32 << DROP) - 1);
    f32::from_bits(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf32_keeps_ten_mantissa_bits_rounding_to_nearest_even() {
        let one = 1.0f32;
        let ulp = 2f32.powi(-10); // TF32's spacing at 1
        assert_eq!(round_tf32(one + ulp), one + ulp);
        assert_eq!(round_tf32(one + 0.49 * ulp), one);
        assert_eq!(round_tf32(one + 0.51 * ulp), one + ulp);
        // Ties go to the even mantissa: 1 + ulp/2 down to 1, 1 + 3ulp/2 up to 1 + 2ulp.
        assert_eq!(round_tf32(one + 0.5 * ulp), one);
        assert_eq!(round_tf32(one + 1.5 * ulp), one + 2.0 * ulp);
        assert_eq!(round_tf32(-(one + 0.51 * ulp)), -(one + ulp));
        assert_eq!(round_tf32(f32::MAX), f32::INFINITY);
        assert!(round_tf32(f32::NAN).is_nan());
        assert_eq!(round_tf32(f32::NEG_INFINITY), f32::NEG_INFINITY);
    }

    #[test]
    fn bf16_keeps_seven_stored_mantissa_bits_and_f32_changes_nothing() {
        let v = 1.0 + 2f32.powi(-8) * 1.01; // just over half a bf16 ulp (2^-7) above 1
        let mut x = [v, 3.0];
        Precision::F32.round_matmul_input(&mut x);
        assert_eq!(x, [v, 3.0]);
        Precision::Tf32.round_activation(&mut x);
        assert_eq!(x, [v, 3.0]);
        Precision::Bf16.round_matmul_input(&mut x);
        assert_eq!(x, [1.0 + 2f32.powi(-7), 3.0]);
    }

    /// f32 runs on the tensors themselves (bit-identical to before precisions existed); a
    /// reduced precision is exactly the f32 product of rounded inputs.
    #[test]
    fn the_host_backend_rounds_only_what_its_precision_says() {
        use crate::backend::Backend;
        use crate::cpu::Cpu;
        use crate::{cpu, Tensor};
        let x = Tensor::new(&[2, 3], (0..6).map(|i| 1.0 + 0.0123 * i as f32).collect()).unwrap();
        let w = Tensor::new(&[3, 2], (0..6).map(|i| 0.3 - 0.0456 * i as f32).collect()).unwrap();
        let f32_cpu = Cpu::new(Precision::F32);
        assert_eq!(
            f32_cpu.matmul(&x, &w).unwrap(),
            cpu::matmul(&x, &w).unwrap()
        );
        let mut h = x.clone();
        f32_cpu.round_activation(&mut h).unwrap();
        assert_eq!(h, x);
        for p in [Precision::Tf32, Precision::Bf16] {
            let round = |t: &Tensor| {
                let mut t = t.clone();
                p.round_matmul_input(t.data_mut());
                t
            };
            let got = Cpu::new(p).matmul(&x, &w).unwrap();
            assert_eq!(got, cpu::matmul(&round(&x), &round(&w)).unwrap(), "{p}");
            assert_ne!(got, cpu::matmul(&x, &w).unwrap(), "{p} rounds");
            let mut acc = Tensor::zeros(&[3, 3]);
            Cpu::new(p).matmul_tn_acc(&x, &x, &mut acc).unwrap();
            let mut want = Tensor::zeros(&[3, 3]);
            cpu::matmul_tn_acc(&round(&x), &round(&x), &mut want).unwrap();
            assert_eq!(acc, want, "{p}: f32 accumulator");
        }
        let mut h = x.clone();
        Cpu::new(Precision::Bf16).round_activation(&mut h).unwrap();
        assert_eq!(h, round_all(&x));
    }

    fn round_all(t: &crate::Tensor) -> crate::Tensor {
        let mut t = t.clone();
        round_bf16(t.data_mut());
        t
    }
}
