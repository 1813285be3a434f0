//! Measured memory of one rank per step, by the categories of
//! [`MemoryBreakdown`]: counters the executor moves as tensors change hands, so the figures
//! are the storage actually held (as the modules and the communicator count it), and
//! measuring allocates nothing per action.
//!
//! What each category counts here:
//! - parameters, gradients, optimizer state: what the stage modules say they hold
//!   ([`StageModule::parameter_bytes`](crate::StageModule::parameter_bytes) and its
//!   siblings), read at the step's start and again after the optimizer (which creates
//!   AdamW's state on the first step);
//! - activations: forward stashes (a recomputed one included) and weight stashes from I to W;
//! - buffers: pipeline hand-offs this rank holds (an output waiting for its send, a
//!   received or same-device input or gradient waiting for its compute) and the gradient
//!   reduction's flat tensors (the all-reduce's, or ZeRO-1's shards and gathered values);
//! - workspace: not counted on the host (temporaries inside one layer's compute are freed
//!   before the action ends and are not tracked); on a GPU the driver's figures
//!   ([`DeviceMemory`]) show everything the device holds.

use pipewright_model::memory::MemoryBreakdown;
use serde::{Deserialize, Serialize};

/// One rank's measured memory in one step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct RankMemory {
    /// What the rank held at the moment of the step's highest total (the figure a memory
    /// model predicts; the earliest such moment).
    pub peak: MemoryBreakdown,
    /// Each category's own maximum over the step (maxima of different moments, so their
    /// total can exceed `peak`'s).
    pub max: MemoryBreakdown,
    /// The GPU driver's figures at the step's end, where the rank's modules run on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceMemory>,
}

/// A GPU's memory as its driver reports it (the whole device: every rank and process on it,
/// allocator caches and library workspaces included).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Free bytes.
    pub free: u64,
    /// Bytes of the device.
    pub total: u64,
}

impl DeviceMemory {
    /// Bytes in use: total less free.
    pub fn used(&self) -> u64 {
        self.total.saturating_sub(self.free)
    }
}

/// A category of [`MemoryBreakdown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    Buffers,
}

fn field(b: &mut MemoryBreakdown, c: Category) -> &mut u64 {
    match c {
        Category::Parameters => &mut b.parameters,
        Category::Gradients => &mut b.gradients,
        Category::OptimizerState => &mut b.optimizer_state,
        Category::Activations => &mut b.activations,
        Category::Buffers => &mut b.buffers,
    }
}

/// The counters of one step: what is held now, each category's maximum, and the holdings
/// at the highest total so far.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meter {
    now: MemoryBreakdown,
    max: MemoryBreakdown,
    peak: MemoryBreakdown,
}

impl Meter {
    /// Count `n` more bytes of `c`.
    pub(crate) fn add(&mut self, c: Category, n: u64) {
        let v = field(&mut self.now, c);
        *v += n;
        let v = *v;
        let m = field(&mut self.max, c);
        *m = (*m).max(v);
        if self.now.total() > self.peak.total() {
            self.peak = self.now;
        }
    }

    /// Count `n` bytes of `c` released.
    pub(crate) fn sub(&mut self, c: Category, n: u64) {
        let v = field(&mut self.now, c);
        *v = v.saturating_sub(n);
    }

    /// Set `c` to `n` bytes (a figure a module reports whole).
    pub(crate) fn set(&mut self, c: Category, n: u64) {
        let held = *field(&mut self.now, c);
        if n >= held {
            self.add(c, n - held);
        } else {
            self.sub(c, held - n);
        }
    }

    /// Bytes of `c` held now.
    pub(crate) fn now(&self, c: Category) -> u64 {
        let mut b = self.now;
        *field(&mut b, c)
    }

    /// Each category's maximum so far.
    pub(crate) fn max(&self) -> MemoryBreakdown {
        self.max
    }

    /// The step's figures.
    pub(crate) fn finish(&self, device: Option<DeviceMemory>) -> RankMemory {
        RankMemory {
            peak: self.peak,
            max: self.max,
            device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_moment_of_the_highest_total_and_max_each_categorys_own() {
        let mut m = Meter::default();
        m.set(Category::Parameters, 100);
        m.add(Category::Activations, 50);
        m.add(Category::Buffers, 10);
        m.sub(Category::Activations, 50);
        m.add(Category::Buffers, 30);
        let r = m.finish(None);
        assert_eq!(
            (r.peak.parameters, r.peak.activations, r.peak.buffers),
            (100, 50, 10)
        );
        assert_eq!(r.peak.total(), 160);
        assert_eq!((r.max.activations, r.max.buffers), (50, 40));
        assert_eq!(m.now(Category::Buffers), 40);
        m.set(Category::Parameters, 20);
        assert_eq!(m.now(Category::Parameters), 20);
        assert_eq!(m.max().parameters, 100);
    }
}
