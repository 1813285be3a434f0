"""The `pipewright` command that `pip install ./python` installs (a console script running
the Rust CLI through the extension) behaves as the `pipewright` binary does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

from torch_launch import pipewright_bin

SCHEDULE = ["schedule", "--schedule", "interleaved-1f1b", "--stages", "4", "--virtual", "2",
            "--microbatches", "8", "--format", "json"]

def console_script() -> str:
    """The installed `pipewright` script: in this interpreter's scripts folder, where pip (and
    `maturin develop`) put the package's `[project.scripts]`."""
    names = [ep.name for ep in metadata.entry_points(group="console_scripts")
             if ep.value == "pipewright._cli:main"]
    assert names == ["pipewright"], f"the installed package declares {names}: reinstall it"
    script = Path(sysconfig.get_path("scripts")) / "pipewright"
    assert script.is_file(), f"{script} is missing: reinstall the package"
    return str(script)

def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

def test_schedule_prints_what_the_binary_prints():
    ours = run([console_script(), *SCHEDULE])
    theirs = run([pipewright_bin(), *SCHEDULE])
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    assert json.loads(ours.stdout)  # a whole document, flushed before the interpreter exits

def test_bad_flag_is_one_error_line_and_exit_2():
    ours = run([console_script(), "schedule", "--stages", "4", "--no-such-flag"])
    theirs = run([pipewright_bin(), "schedule", "--stages", "4", "--no-such-flag"])
    assert ours.returncode == theirs.returncode == 2
    lines = ours.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), ours.stderr
    assert ours.stderr == theirs.stderr
    assert ours.stdout == ""

def test_library_error_is_one_error_line_and_exit_1(tmp_path):
    missing = tmp_path / "none.csv"
    ours = run([console_script(), "validate", str(missing)])
    theirs = run([pipewright_bin(), "validate", str(missing)])
    assert ours.returncode == theirs.returncode == 1
    assert ours.stderr == theirs.stderr
    assert ours.stderr.startswith("error: ") and ours.stderr.count("\n") == 1

def test_module_form_runs_the_command():
    # `plan --validate` runs `train` again this way: `python -m pipewright._cli`.
    done = run([sys.executable, "-m", "pipewright._cli", *SCHEDULE])
    assert done.returncode == 0, done.stderr
    assert done.stdout == run([pipewright_bin(), *SCHEDULE]).stdout

def test_ctrl_c_stops_a_long_search():
    # Minutes of work (the binary alone takes over 10 s before its first line).
    cmd = [console_script(), "search", "--stages", "32", "--microbatches", "256",
           "--memory-cap", "32", "--max-virtual", "8", "--improve", "100000",
           "--time-budget", "600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(3)
        assert proc.poll() is None, "the search ended before Ctrl-C: make it longer"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        proc.wait(timeout=10)
        assert time.monotonic() - start < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ended by the signal, as the binary is.
    assert proc.returncode == -signal.SIGINT


def test_plan_validate_runs_train_through_the_console_script():
    # `plan --validate` runs `train` as a child: here as `python -m pipewright._cli train ...`,
    # since this process's executable is the interpreter, not `pipewright`.
    done = run([console_script(), "plan", "--layers", "2", "--d-model", "32", "--heads", "2",
                "--seq-len", "8", "--vocab", "32", "--gpus", "2", "--global-batch", "8",
                "--precision", "f32", "--validate", "2"])
    assert done.returncode == 0, done.stderr
    assert "validation: 2 configurations" in done.stdout
    assert "Spearman rank correlation, predicted against measured" in done.stdout
