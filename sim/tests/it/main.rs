//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

mod closed_forms;
mod comm;
mod dualpipev;
mod host;
mod properties;
mod readers_fuzz;
mod recompute;
mod simulate;
mod steady;
mod timeline_check;
mod zero_bubble;
