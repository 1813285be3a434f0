"""The `pipewright` command installed with the package (`[project.scripts]`).

It runs the same Rust command line as the `pipewright` binary, through the extension, built
with default features (no MPI or GPU transports: `cargo install --path cli --features ...`
for those). `python -m pipewright._cli ...` runs it too.
"""

import signal
import sys

from ._native import cli_main


def main() -> None:
    """Runs `pipewright` with this process's arguments and exits with its status."""
    # Ctrl-C stops the command as it stops the binary: the default action ends the process.
    # Python's own handler would only set a flag that nothing checks while Rust runs.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # How `plan --validate` runs `train` again: this interpreter, this package. Not `-m`, which
    # puts the working directory first on the path (a source tree there would shadow the
    # installed package).
    self_command = [sys.executable, "-c",
                    "import sys; del sys.path[0]; from pipewright._cli import main; main()"]
    sys.exit(cli_main(["pipewright", *sys.argv[1:]], self_command))


if __name__ == "__main__":
    main()
