//! The `pipewright` command line.

pub mod args;
pub mod bench;
pub mod budget;
pub mod calibrate;
pub mod charts;
pub mod checks;
pub mod commands;
pub mod console;
pub mod io;
pub mod measured;
pub mod memory;
pub mod outputs;
pub mod plan;
pub mod plan_searched;
mod plan_table;
pub mod progress;
pub mod search;
pub mod self_command;
pub mod shape;
pub mod steady;
pub mod timetable_out;
pub mod train;
pub mod validate_plan;
