//! The `pipewright` command line run inside Python: the console script that `pip install`
//! puts on the PATH (`pipewright._cli.main`) calls [`cli_main`], so one install gives both the
//! package and the command. The command is the same Rust code as the `pipewright` binary
//! (`pipewright_cli`), built with its default features: no MPI, no CUDA.

use std::ffi::OsString;
use std::io::Write;

use pyo3::prelude::*;

/// Runs the command line `argv` (the program's name first) and returns its exit status.
/// `self_command` is how to run the command again (`python -m pipewright._cli`), which
/// `plan --validate` does to run `train` as a child. The interpreter is released: the
/// command writes to the process's own standard output and error, as the binary does.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<OsString>, self_command: Vec<OsString>) -> i32 {
    py.detach(|| {
        // A panic ends the binary with 101 after its message; here it would become a Python
        // traceback with status 1, the status of an ordinary `error:` line. Keep the binary's.
        let run = std::panic::AssertUnwindSafe(|| pipewright_cli::run_embedded(argv, self_command));
        let code = std::panic::catch_unwind(run).map_or(101, i32::from);
        // A binary's exit flushes Rust's standard output; here the interpreter exits
        // instead, so a last line without a newline is flushed now. A reader gone away
        // is the command's business, already handled.
        let _ = std::io::stdout().flush();
        code
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli_main, m)?)
}
