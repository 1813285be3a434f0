//! pipewright: pipeline-parallel training with schedules that are data.
#![deny(missing_docs)]

pub use pipewright_kernels as kernels;
pub use pipewright_runtime as runtime;
pub use pipewright_schedule as schedule;
pub use pipewright_viz as viz;
