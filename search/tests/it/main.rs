//! Every integration test of this crate in one binary: one link instead of one per file.
//! Run one with `cargo test -p pipewright-search --test it <name>::`.

mod comm_search;
mod memory_search;
mod search;
mod search_budget;
mod search_recompute;
mod stash_agree;
