//! `pipewright`: generate, check, simulate and draw pipeline-parallel schedules.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(pipewright_cli::run_from(std::env::args_os()))
}
