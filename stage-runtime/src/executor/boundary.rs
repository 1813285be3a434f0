//! What crosses a stage boundary, checked where it is produced: a forward's output against
//! the hand-off's shape, an input gradient against the input it belongs to, and (with the NaN
//! check, on host tensors) their values. A mistake is named at the stage that made it, not
//! at the kernel of the stage that receives it.
//!
//! A hand-off's shape is fixed by the stage's first forward (microbatch 0 of the first step):
//! every microbatch hands the next stage the same shape, as PyTorch's pipelining and Megatron
//! expect. Each stage's inputs are then all of the shape of its first, so an input gradient
//! is checked against that shape, with no per-microbatch record. The cost per hand-off is a
//! shape comparison (and one scan of a host tensor under the NaN check).

use std::any::Any;

use pipewright_kernels::{Shaped, Tensor};
use pipewright_schedule::Action;

use crate::error::RuntimeError;
use crate::mesh::Coord;
use crate::module::{first_non_finite, ModuleError};

/// The shapes a stage's hand-offs are held to, fixed by its first forward.
#[derive(Debug, Default)]
pub(crate) struct Handoffs {
    /// The stage's input (its previous stage's output), `None` on the first stage.
    input: Option<Vec<usize>>,
    /// The stage's output, `None` on the last stage.
    output: Option<Vec<usize>>,
}

/// A boundary mistake found inside a compute action, turned into a [`RuntimeError`] with the
/// rank, step and action once out of it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Boundary {
    #[error("shape")]
    Shape {
        stage: u32,
        what: &'static str,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("non-finite")]
    NonFinite {
        stage: u32,
        what: &'static str,
        value: f32,
    },
}

impl Handoffs {
    /// Note the shape of a forward's input (the first one fixes it).
    pub(crate) fn input<T: Shaped>(&mut self, x: &T) {
        if self.input.is_none() {
            self.input = Some(x.shape().to_vec());
        }
    }

    /// Check a forward's output against the hand-off's shape (the first one fixes it).
    pub(crate) fn output<T: Shaped + 'static>(
        &mut self,
        stage: u32,
        y: &T,
        check_finite: bool,
    ) -> Result<(), ModuleError> {
        let want = self.output.get_or_insert_with(|| y.shape().to_vec());
        held_to(stage, "forward output", y, want, check_finite)
    }

    /// Check an input gradient against the stage's input.
    pub(crate) fn input_grad<T: Shaped + 'static>(
        &self,
        stage: u32,
        g: &T,
        check_finite: bool,
    ) -> Result<(), ModuleError> {
        match &self.input {
            Some(want) => held_to(stage, "input gradient", g, want, check_finite),
            None => Ok(()),
        }
    }
}

fn held_to<T: Shaped + 'static>(
    stage: u32,
    what: &'static str,
    t: &T,
    want: &[usize],
    check_finite: bool,
) -> Result<(), ModuleError> {
    if t.shape() != want {
        return Err(Box::new(Boundary::Shape {
            stage,
            what,
            got: t.shape().to_vec(),
            want: want.to_vec(),
        }));
    }
    // Device tensors are not scanned here: a download per hand-off is not cheap.
    let host = (t as &dyn Any).downcast_ref::<Tensor>();
    match host.and_then(|h| first_non_finite(h.data())) {
        Some(value) if check_finite => Err(Box::new(Boundary::NonFinite { stage, what, value })),
        _ => Ok(()),
    }
}

/// `e` as the run's error, when it is a [`Boundary`] mistake.
pub(crate) fn boundary_error(
    e: &ModuleError,
    (rank, coord, step): (usize, Coord, u64),
    action: Action,
) -> Option<RuntimeError> {
    Some(match e.downcast_ref::<Boundary>()? {
        Boundary::Shape {
            what, got, want, ..
        } => RuntimeError::HandOff {
            rank,
            coord,
            step,
            action,
            what,
            got: got.as_slice().into(),
            want: want.as_slice().into(),
        },
        Boundary::NonFinite { stage, what, value } => RuntimeError::NonFinite {
            rank,
            coord,
            step,
            stage: *stage,
            microbatch: Some(action.microbatch),
            what,
            value: *value,
        },
    })
}
