//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

mod fit_cache;
mod memory_shapes;
mod moe_plan;
mod plan;
mod plan_published;
mod plan_published_llama;
mod plan_searched;
mod requests;
