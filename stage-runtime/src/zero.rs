//! ZeRO levels of the data-parallel optimizer (Rajbhandari et al.), as far as a pipeline
//! allows: level 1 shards the optimizer state over each stage's data-parallel group.
//!
//! Under ZeRO-1 a stage's flat gradients are reduce-scattered as soon as its last backward
//! of the step is done (where level 0 starts its all-reduce); each replica then steps AdamW
//! on its shard of the flat parameters alone ([`crate::comm::shard_range`]: contiguous
//! shards of `ceil(n / d)` values, the last ones shorter) and the updated shards are
//! all-gathered into every replica. The reduce-scatter sums in the all-reduce's order and the
//! shard's update is the whole optimizer's value for value, so the run's losses and
//! parameters are level 0's to the bit on the CPU transports.
//!
//! Levels 2 and 3 also shard gradients (and parameters). A pipeline accumulates every
//! stage's gradients over all its microbatches before the step's last backward, so it cannot
//! drop the other replicas' shards early: those levels are refused with pp > 1 (as DeepSpeed
//! does), and not implemented here without a pipeline either.

/// Which ZeRO level a run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Zero {
    /// Level 0: every replica holds the whole optimizer state; gradients are all-reduced.
    #[default]
    Off,
    /// Level 1: each replica holds the optimizer state of its shard of the parameters.
    /// With one data-parallel replica it changes nothing (the one shard is everything).
    One,
}

/// Why a ZeRO level cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZeroError {
    /// Levels 2 and 3 with a pipeline.
    #[error("ZeRO-{level} shards the gradients, but a pipeline (pp = {pp}) accumulates every stage's gradients across its microbatches until the step's last backward: use ZeRO-1, which shards only the optimizer state")]
    Pipeline {
        /// The level asked for.
        level: u32,
        /// Pipeline devices.
        pp: usize,
    },
    /// A level this runtime does not implement (or that does not exist).
    #[error("ZeRO-{level} is not available: levels 0 and 1 are")]
    Unsupported {
        /// The level asked for.
        level: u32,
    },
}

impl Zero {
    /// The level `level` for a run of `pp` pipeline devices.
    pub fn from_level(level: u32, pp: usize) -> Result<Zero, ZeroError> {
        match level {
            0 => Ok(Zero::Off),
            1 => Ok(Zero::One),
            2 | 3 if pp > 1 => Err(ZeroError::Pipeline { level, pp }),
            _ => Err(ZeroError::Unsupported { level }),
        }
    }

    /// The level as a number.
    pub fn level(self) -> u32 {
        match self {
            Zero::Off => 0,
            Zero::One => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_two_and_three_are_refused_with_a_pipeline_and_say_why() {
        assert_eq!(Zero::from_level(1, 4), Ok(Zero::One));
        assert_eq!(Zero::from_level(0, 4).map(Zero::level), Ok(0));
        let e = Zero::from_level(2, 2).unwrap_err().to_string();
        assert!(
            e.contains("accumulates every stage's gradients across its microbatches"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        assert!(matches!(
            Zero::from_level(3, 1),
            Err(ZeroError::Unsupported { level: 3 })
        ));
        assert!(matches!(
            Zero::from_level(7, 2),
            Err(ZeroError::Unsupported { level: 7 })
        ));
    }
}
