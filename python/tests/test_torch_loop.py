"""The loop, end to end, as the README's "From PyTorch" gives it: run 1F1B in PyTorch and record
it, search on the recorded costs, run the searched timetable in PyTorch with the gradients of
one process. The training script is the example a user starts from, under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pipewright.torch as pwt
from torch_launch import REPO, cli, env_for, free_port

EXAMPLE = REPO / "python" / "examples" / "torch_pipeline.py"


def torchrun(nproc: int, *args, timeout: float = 240.0) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), str(EXAMPLE), *map(str, args)]
    env = env_for(0, nproc, 0)
    for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(k)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        raise AssertionError(f"torchrun passed {timeout} s and was stopped:\n{out[-4000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def test_measure_search_run(tmp_path):
    p, m = 2, 8
    first = tmp_path / "1f1b.csv"
    cli("schedule", "--schedule", "1f1b", "-p", p, "-m", m, "-o", first)
    costs, step = tmp_path / "costs.json", tmp_path / "step.json"
    out = torchrun(p, "--timetable", first, "--layers", 24, "--width", 64, "--steps", 4,
                   "--costs-out", costs, "--timeline", step)
    assert f"wrote {costs}" in out and f"wrote {step}" in out
    measured = json.loads(costs.read_text())
    assert len(measured["stages"]) == p and measured["time_unit"] == "ms"
    cli("viz", "--from", step, "-o", tmp_path / "step.svg")

    best = tmp_path / "best.csv"
    found = cli("search", "-p", p, "-m", m, "--cost-file", costs, "--memory-cap", p,
                "--time-budget", 20, "--timetable-out", best).stdout
    assert "best:" in found
    tt = pwt.load(best)
    assert tt.form == "compute_only" and tt.num_ranks == p and tt.microbatches == m

    out = torchrun(p, "--timetable", best, "--layers", 24, "--width", 64, "--steps", 1,
                   "--warmup", 0, "--check")
    assert "gradients against one process" in out and "(equal)" in out, out
