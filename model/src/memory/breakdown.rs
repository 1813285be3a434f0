//! [`MemoryBreakdown`]: one rank's bytes by category.

use serde::{Deserialize, Serialize};

/// One rank's bytes by category (a peak, or the holdings of one moment), predicted or
/// measured.
#[derive(Serialize, Deserialize, Clone, Copy, Default, Debug, PartialEq)]
pub struct MemoryBreakdown {
    /// Parameter values (master weights included).
    pub parameters: u64,
    /// Accumulated gradients.
    pub gradients: u64,
    /// Optimizer state (AdamW's moments; under ZeRO-1 the rank's shard).
    pub optimizer_state: u64,
    /// Activations stashed for backwards (forward and weight stashes).
    pub activations: u64,
    /// Communication buffers: pipeline hand-offs held and gradient-reduction tensors.
    pub buffers: u64,
    /// Scratch of the compute itself, beyond what it keeps.
    pub workspace: u64,
}

impl MemoryBreakdown {
    /// Bytes of every category together (saturating: a prediction past `u64` is "too
    /// much", never a small number that would fit).
    pub fn total(&self) -> u64 {
        [
            self.gradients,
            self.optimizer_state,
            self.activations,
            self.buffers,
            self.workspace,
        ]
        .into_iter()
        .fold(self.parameters, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_adds_every_category_and_json_names_them() {
        let m = MemoryBreakdown {
            parameters: 1,
            gradients: 2,
            optimizer_state: 4,
            activations: 8,
            buffers: 16,
            workspace: 32,
        };
        assert_eq!(m.total(), 63);
        let json = serde_json::to_value(m).unwrap();
        assert_eq!(json["optimizer_state"], 4);
        assert_eq!(serde_json::from_value::<MemoryBreakdown>(json).unwrap(), m);
    }
}
