//! One rank's memory by category, in bytes: what the model predicts and the runtime measures.

use serde::{Deserialize, Serialize};

/// One rank's peak memory (predicted or measured), by category, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    /// Model weights held by the rank (its TP shard of its stages).
    pub parameters: u64,
    /// Gradients of those weights.
    pub gradients: u64,
    /// Optimizer state: AdamW's moments, and f32 master weights where parameters are not f32
    /// (the rank's ZeRO-1 shard of them under `--zero 1`).
    pub optimizer_state: u64,
    /// Stashed activations of in-flight microbatches, at the rank's peak.
    pub activations: u64,
    /// Communication buffers (hand-offs, flat gradients for the data-parallel reduction).
    pub buffers: u64,
    /// Transient working memory of the kernels.
    pub workspace: u64,
}

impl MemoryBreakdown {
    /// The sum of every category.
    pub fn total(&self) -> u64 {
        self.parameters
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.buffers
            + self.workspace
    }
}
