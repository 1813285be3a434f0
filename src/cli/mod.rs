//! The `pipewright` command line.

pub mod args;
pub mod commands;
pub mod io;
