//! The two 16-bit floats a host tensor is stored or sent as, bf16 and IEEE f16: rounded from
//! f32 to nearest, ties to even, and widened back exactly.
//!
//! Why not the `half` crate, which we used before: it builds zerocopy and its derive, about a
//! tenth of a user's cold release build of a model (4.5 s of 64 s of CPU), for these four
//! conversions. The tests check every f16 and bf16 value and millions of f32 values against
//! `half`, a dev-dependency, so only our tests build it. The CUDA backend keeps `half`, whose
//! types cudarc's cuBLAS takes.

/// A bf16 value (f32's sign and 8-bit exponent, 7 stored mantissa bits), as its bits.
/// Equality and hashing compare the bits: `-0 != +0`, and a NaN equals the same NaN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// An IEEE 754 binary16 value (5-bit exponent, 10 stored mantissa bits), as its bits.
/// Equality and hashing compare the bits, as for [`Bf16`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

/// Whether dropping the low `drop` bits of `bits` rounds up: more than half an ulp, or
/// exactly half with an odd kept part (ties to even).
fn rounds_up(bits: u32, drop: u32) -> bool {
    let half = 1u32 << (drop - 1);
    let rest = bits & ((half << 1) - 1);
    rest > half || (rest == half && (bits >> drop) & 1 == 1)
}

impl Bf16 {
    /// `x` rounded to nearest, ties to even; a NaN stays a (quiet) NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) | 0x0040) as u16);
        }
        // A carry out of the mantissa steps the exponent, up to infinity: the right rounding.
        Bf16(((bits >> 16) + u32::from(rounds_up(bits, 16))) as u16)
    }

    /// The value as an f32 (exact).
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }

    /// Its two bytes, little-endian.
    pub fn to_le_bytes(self) -> [u8; 2] {
        self.0.to_le_bytes()
    }

    /// A value from its two bytes, little-endian.
    pub fn from_le_bytes(b: [u8; 2]) -> Bf16 {
        Bf16(u16::from_le_bytes(b))
    }
}

impl F16 {
    /// `x` rounded to nearest, ties to even: beyond 65504 (after rounding) it is infinite,
    /// below 2^-14 subnormal, and a NaN stays a (quiet) NaN.
    pub fn from_f32(x: f32) -> F16 {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let man = bits & 0x007f_ffff;
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15; // rebiased for f16
        if x.is_nan() {
            return F16(sign | 0x7e00 | (man >> 13) as u16);
        }
        if exp >= 0x1f {
            return F16(sign | 0x7c00); // too large, or infinite
        }
        if exp <= 0 {
            // Subnormal: the implicit bit joins the mantissa, shifted right by 1 - exp more.
            let shift = (14 - exp) as u32;
            if shift > 24 {
                return F16(sign); // below half the smallest subnormal
            }
            let full = man | 0x0080_0000;
            return F16(sign | ((full >> shift) + u32::from(rounds_up(full, shift))) as u16);
        }
        // A carry out of the mantissa steps the exponent, up to infinity: the right rounding.
        let kept = ((exp as u32) << 10) | (man >> 13);
        F16(sign | (kept + u32::from(rounds_up(man, 13))) as u16)
    }

    /// The value as an f32 (exact).
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let (exp, man) = ((h >> 10) & 0x1f, h & 0x3ff);
        let magnitude = match exp {
            // Zero and subnormals: man * 2^-24, exact in f32.
            0 => (man as f32 * f32::from_bits(0x3380_0000)).to_bits(),
            0x1f if man == 0 => 0x7f80_0000,
            0x1f => 0x7fc0_0000 | (man << 13),
            _ => ((exp + 127 - 15) << 23) | (man << 13),
        };
        f32::from_bits(sign | magnitude)
    }

    /// Its two bytes, little-endian.
    pub fn to_le_bytes(self) -> [u8; 2] {
        self.0.to_le_bytes()
    }

    /// A value from its two bytes, little-endian.
    pub fn from_le_bytes(b: [u8; 2]) -> F16 {
        F16(u16::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Same value, or both NaN.
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn every_16_bit_value_widens_as_half_widens_it() {
        for bits in 0..=u16::MAX {
            let (ours, theirs) = (Bf16(bits).to_f32(), half::bf16::from_bits(bits).to_f32());
            assert!(same(ours, theirs), "bf16 {bits:#06x}: {ours} vs {theirs}");
            let (ours, theirs) = (F16(bits).to_f32(), half::f16::from_bits(bits).to_f32());
            assert!(same(ours, theirs), "f16 {bits:#06x}: {ours} vs {theirs}");
        }
    }

    /// Every f32 whose top 16 bits are any of 65,536 and whose low bits sit at or beside
    /// bf16's and f16's rounding points, then 4 million pseudo-random ones.
    fn samples() -> impl Iterator<Item = u32> {
        let low = [
            0u32, 1, 0x0fff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001,
        ];
        let edges =
            (0..=0xffffu32).flat_map(move |hi| low.into_iter().map(move |lo| hi << 16 | lo));
        let mut state = 0x9e37_79b9u32;
        let random = (0..4_000_000).map(move |_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        });
        edges.chain(random)
    }

    #[test]
    fn f32_rounds_to_the_16_bit_values_half_rounds_to() {
        // The same bits, or both a NaN (half and we may keep different payloads).
        let check = |what: &str, x: f32, ours: u16, nan: bool, theirs: u16| {
            assert!(
                ours == theirs || (x.is_nan() && nan),
                "{what} of {:#010x}: {ours:#06x} vs {theirs:#06x}",
                x.to_bits()
            );
        };
        for x in samples().map(f32::from_bits) {
            let ours = Bf16::from_f32(x);
            let theirs = half::bf16::from_f32(x).to_bits();
            check("bf16", x, ours.0, ours.to_f32().is_nan(), theirs);
            let ours = F16::from_f32(x);
            let theirs = half::f16::from_f32(x).to_bits();
            check("f16", x, ours.0, ours.to_f32().is_nan(), theirs);
        }
    }

    /// Every rounding point of f16: the midpoint between each pair of neighbouring values
    /// (exact in f32), one f32 step either side, both signs. (bf16's are the f32 values
    /// whose low 16 bits are 0x8000, which `samples` holds, with their neighbours.)
    #[test]
    fn every_f16_midpoint_and_its_neighbours_round_as_half_rounds_them() {
        for h in 0..0x7c00u16 {
            let lo = f64::from(F16(h).to_f32());
            let hi = if h == 0x7bff {
                65536.0 // what would follow 65504: its midpoint is where infinity starts
            } else {
                f64::from(F16(h + 1).to_f32())
            };
            let mid = ((lo + hi) / 2.0) as f32;
            for bits in [mid.to_bits() - 1, mid.to_bits(), mid.to_bits() + 1] {
                for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                    let (ours, theirs) = (F16::from_f32(x).0, half::f16::from_f32(x).to_bits());
                    assert_eq!(ours, theirs, "f16 of {x:e} ({bits:#010x})");
                }
            }
        }
    }

    #[test]
    fn rounding_ties_go_to_even_and_overflow_to_infinity() {
        // 1 + 2^-11 is halfway between f16's 1 and 1 + 2^-10: to even, 1.
        assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        assert_eq!(F16::from_f32(65504.0).to_f32(), 65504.0);
        assert_eq!(F16::from_f32(65520.0).to_f32(), f32::INFINITY);
        assert_eq!(F16::from_f32(2f32.powi(-24)).to_f32(), 2f32.powi(-24));
        assert_eq!(F16::from_f32(2f32.powi(-25)).to_f32(), 0.0);
        // Halfway between the subnormals 2^-24 and 2 * 2^-24: to the even one.
        assert_eq!(F16::from_f32(1.5 * 2f32.powi(-24)).0, 2);
        assert_eq!(F16::from_f32(2.5 * 2f32.powi(-24)).0, 2);
        assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert!(F16::from_f32(-f32::NAN).to_f32().is_nan());
    }
}
