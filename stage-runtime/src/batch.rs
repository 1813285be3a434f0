//! The user's data as the runtime carries it: one value of the module's own type per
//! microbatch, built on each rank for its (step, data-parallel rank, microbatch), never
//! sent between ranks; the loss scale is the runtime's.

use crate::module::ModuleError;

/// Which microbatch a data function is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MicrobatchId {
    /// Training step.
    pub step: u64,
    /// Data-parallel rank.
    pub dp: usize,
    /// Microbatch within this rank's share of the step (`0..microbatches`).
    pub microbatch: u32,
    /// Microbatches per data-parallel rank and step (the timetable's `m`).
    pub microbatches: u32,
}

impl MicrobatchId {
    /// Its index within the step's global batch of `dp * m` microbatches: `dp * m +
    /// microbatch`, so data-parallel ranks train on disjoint parts and a single device
    /// going through `0..dp * m` sees the same data.
    pub fn global(&self) -> u64 {
        self.dp as u64 * u64::from(self.microbatches) + u64::from(self.microbatch)
    }
}

/// The microbatches one data-parallel rank trains on in one step.
#[derive(Clone, Debug, Default)]
pub struct StepBatch<D> {
    /// The user's data, per microbatch.
    pub microbatches: Vec<D>,
    /// Loss scale of every microbatch: `1 / (dp * m)`.
    pub loss_scale: f32,
}

impl<D> StepBatch<D> {
    /// Step `step` of data-parallel rank `dp` (of `dp_size`), `m` microbatches each built by
    /// `data`.
    pub fn build(
        step: u64,
        (dp, dp_size): (usize, usize),
        m: u32,
        data: &impl Fn(MicrobatchId) -> Result<D, ModuleError>,
    ) -> Result<Self, ModuleError> {
        let microbatches = (0..m)
            .map(|microbatch| {
                data(MicrobatchId {
                    step,
                    dp,
                    microbatch,
                    microbatches: m,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(StepBatch {
            microbatches,
            loss_scale: 1.0 / (dp_size as f32 * m as f32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_asks_for_each_microbatch_of_its_rank_once_and_scales_by_the_global_batch() {
        let b = StepBatch::build(3, (1, 2), 4, &|id| Ok(id)).unwrap();
        let globals: Vec<u64> = b.microbatches.iter().map(MicrobatchId::global).collect();
        assert_eq!(globals, [4, 5, 6, 7]);
        assert!(b.microbatches.iter().all(|id| id.step == 3 && id.dp == 1));
        assert_eq!(b.loss_scale, 0.125);
        let e = StepBatch::<()>::build(0, (0, 1), 2, &|_| Err("no file".into())).unwrap_err();
        assert_eq!(e.to_string(), "no file");
    }
}
