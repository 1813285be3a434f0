//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

mod hf_config;
mod hf_moe;
mod memory_partial;
