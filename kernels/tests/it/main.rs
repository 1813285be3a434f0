//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

#[path = "../common/mod.rs"]
mod common;

mod gpt;
mod gradcheck;
mod gradcheck_shapes;
mod moe;
mod moe_ep;
mod moe_gpt;
mod precision;
mod seq_parallel;
mod tp;
