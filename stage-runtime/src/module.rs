//! `StageModule`, what a user implements for one chunk of a model (from `pipewright-stage`,
//! re-exported here), and the runtime's two implementations: the reference GPT
//! ([`GptModule`]) and synthetic stages of exact durations ([`SyntheticModule`]).

pub use gpt::GptModule;
pub use pipewright_stage::module::*;
pub use synthetic::SyntheticModule;

mod gpt;
mod synthetic;
