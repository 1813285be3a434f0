//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

// Shared by several modules; each file is compiled once.
#[path = "../common/user_mlp.rs"]
#[allow(dead_code)]
mod user_mlp;
#[path = "../common/whole.rs"]
#[allow(dead_code)]
mod whole;

mod equality;
mod faults;
mod full_backward;
mod generic;
mod layer_memory;
mod layer_tp;
mod memory;
mod memory_model;
mod model_shapes;
mod module_checks;
mod moe;
mod moe_memory;
mod non_finite;
mod partial_recompute;
mod precision;
mod recompute;
mod seq_parallel;
mod split;
mod user_mistakes;
mod zero;
