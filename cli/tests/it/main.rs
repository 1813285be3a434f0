//! Every integration test of this crate in one binary: one link instead of one per file.
//! Each module is what was once its own `tests/<name>.rs`; run one with
//! `cargo test --test it <name>::`.

mod common;

mod bad_input;
mod cli;
mod comm_cli;
mod custom_mlp;
mod features;
mod flags;
mod golden;
mod harden;
mod limits;
mod long_work;
mod memory_cli;
mod moe_cli;
mod outputs;
mod plan_cli;
mod plan_profile_cli;
mod plan_searched_cli;
mod plan_shapes_cli;
mod pytorch_csv_cli;
mod recompute_cli;
mod search_cli;
mod shape_cli;
mod steady_cli;
