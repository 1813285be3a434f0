//! The number format of a run: what its matmuls read and what its activations are stored as.
//! Master weights, gradients and optimizer moments are f32 in every precision.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a run computes: the format of matmul inputs (which peak FLOP/s applies) and of stored
/// activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (bit-identical to a backend without a precision).
    #[default]
    F32,
    /// Matmul inputs rounded to TF32 (f32's exponent, 10 mantissa bits), f32 accumulation;
    /// activations in f32.
    Tf32,
    /// Matmul inputs rounded to bf16, f32 accumulation (Megatron-style mixed precision); the
    /// residual stream between blocks (so every pipeline hand-off, activation and gradient)
    /// stored as bf16.
    Bf16,
}

impl Precision {
    /// Every precision, in the order the CLI lists them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Tf32, Precision::Bf16];

    /// The name on the command line and in files (`f32`, `tf32`, `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Bytes of one stored activation or pipeline hand-off element.
    pub const fn activation_bytes(self) -> u64 {
        match self {
            Precision::Bf16 => 2,
            Precision::Tf32 | Precision::F32 => 4,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("precision `{s}`: expected bf16, tf32 or f32"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_print_and_serialize_alike() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<Precision>(&json).unwrap(), p);
        }
        assert_eq!(Precision::default(), Precision::F32);
    }

    #[test]
    fn an_unknown_name_is_refused_naming_it_and_the_choices() {
        let e = "fp16".parse::<Precision>().unwrap_err();
        assert_eq!(e, "precision `fp16`: expected bf16, tf32 or f32");
        assert!(serde_json::from_str::<Precision>("\"fp16\"").is_err());
    }

    #[test]
    fn only_bf16_halves_the_stored_activations() {
        assert_eq!(Precision::Bf16.activation_bytes(), 2);
        assert_eq!(Precision::Tf32.activation_bytes(), 4);
        assert_eq!(Precision::F32.activation_bytes(), 4);
    }
}
