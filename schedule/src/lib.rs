//! Pipeline-parallel schedules as data.
#![deny(missing_docs)]

pub mod action;
pub mod timeline;

pub use action::{Action, ActionKind, ParseActionError};
pub use timeline::{Event, MemorySample, Timeline, TimelineMeta, TimelineSource};
