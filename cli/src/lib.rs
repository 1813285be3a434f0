//! The `pipewright` command line as a library: the binary calls [`run_from`] with its
//! arguments, and the Python package's `pipewright` console script calls [`run_embedded`]
//! through its extension, so one install gives the command.

mod cli;

use std::ffi::OsString;

use clap::{Parser, Subcommand};
use cli::bench::BenchCmd;
use cli::charts::{SweepCmd, VizCmd};
use cli::commands::{ScheduleCmd, SimulateCmd, ValidateCmd};
use cli::plan::PlanCmd;
use cli::search::SearchCmd;
use cli::train::TrainCmd;

/// Pipeline-parallel schedules as data: generated, validated, simulated, drawn, executed.
#[derive(Parser, Debug)]
#[command(
    name = "pipewright",
    version,
    about = "Pipeline-parallel training engine: schedules as data, validated, simulated, executed.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a timetable (any family) and print it as a grid, CSV or JSON.
    Schedule(ScheduleCmd),
    /// Check a timetable file: complete, ordered, paired, deadlock-free.
    Validate(ValidateCmd),
    /// Simulate one training step with real durations: makespan, bubbles, memory.
    Simulate(SimulateCmd),
    /// Draw a bubble chart (SVG, PNG or terminal) of a simulated or recorded step.
    Viz(VizCmd),
    /// Simulate schedules over chunk counts: bubble, throughput and memory against m.
    Sweep(SweepCmd),
    /// Find the fastest schedule for your costs that fits a memory cap, with its Pareto front.
    Search(SearchCmd),
    /// Train the reference GPT on in-process devices with any schedule and PP x TP x DP.
    Train(TrainCmd),
    /// Run a timetable with synthetic stages of exact durations and compare with the simulator.
    Bench(BenchCmd),
    /// Choose the whole parallel configuration (TP, PP, DP, schedule, microbatches,
    /// recompute, ZeRO, SP) for a GPT on a cluster, ranked by predicted step time.
    Plan(PlanCmd),
}

/// Clap's refusal as one line (its first, which names the flag, and any tip), exit 2;
/// help and version print as clap prints them.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind::{
        DisplayHelp, DisplayHelpOnMissingArgumentOrSubcommand, DisplayVersion,
    };
    if matches!(
        e.kind(),
        DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        // Help to a closed pipe ends quietly; to a full disk, one line.
        return match e.print() {
            Err(io) if io.kind() != std::io::ErrorKind::BrokenPipe => {
                cli::console::note(&format!("error: cannot write to standard output: {io}"));
                1
            }
            _ => u8::try_from(e.exit_code()).unwrap_or(2),
        };
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("error: bad arguments");
    // "the following required arguments were not provided:" lists them on the next lines.
    let rest: Vec<&str> = lines.clone().collect();
    let missing: Vec<&str> = rest
        .iter()
        .copied()
        .take_while(|l| l.starts_with('-') || l.starts_with('<'))
        .collect();
    let first = if first.ends_with(':') && !missing.is_empty() {
        format!("{first} {}", missing.join(", "))
    } else {
        first.to_string()
    };
    // What the user can write instead is worth keeping: the possible values and the tips.
    let tips: Vec<&str> = lines
        .filter(|l| l.starts_with("tip:") || l.starts_with("[possible values"))
        .collect();
    let mut line = first;
    for tip in tips {
        line += &format!("; {tip}");
    }
    cli::console::note(&format!("{} (see --help)", cli::console::words_cut(&line)));
    2
}

/// Runs the command line `args` (the program's name first, as `std::env::args_os` gives
/// it) and returns the exit status: 0, 1 after an `error:` line, 2 for a usage error.
pub fn run_from<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match &cli.command {
        Command::Schedule(c) => c.run(),
        Command::Validate(c) => c.run(),
        Command::Simulate(c) => c.run(),
        Command::Viz(c) => c.run(),
        Command::Sweep(c) => c.run(),
        Command::Search(c) => c.run(),
        Command::Plan(c) => c.run(),
        Command::Train(c) => c.run(),
        Command::Bench(c) => c.run(),
    };
    match result {
        Ok(()) => 0,
        // The reader of our output went away (`pipewright ... | head`): nothing is wrong.
        Err(e) if cli::console::is_closed_pipe(&e) => 0,
        Err(e) => {
            // One line: the chain of causes, outermost first, long words cut; written in
            // one write, since under mpirun every rank's line shares one terminal.
            cli::console::note(&format!("error: {}", cli::console::one_line(&e)));
            1
        }
    }
}

/// [`run_from`] for a host process that is not this program (the Python console script):
/// `self_command` is how to run `pipewright` again (its program and leading arguments, e.g.
/// `python -m pipewright._cli`), used by `plan --validate` to run `train` as a child.
pub fn run_embedded<I, T>(args: I, self_command: Vec<OsString>) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    cli::self_command::set(self_command);
    run_from(args)
}
