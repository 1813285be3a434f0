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

    # The probe measured the split backward beside the fused one, and the host time.
    assert all({"b", "i", "w"} <= set(st) for st in measured["stages"]), measured
    assert measured["host"]["runtime"] == "pytorch"

    best = tmp_path / "best.csv"
    found = cli("search", "-p", p, "-m", m, "--cost-file", costs, "--memory-cap", p,
                "--time-budget", 20, "--timetable-out", best, "--runners-up", 2).stdout
    assert "best:" in found
    tt = pwt.load(best)
    assert tt.form == "compute_only" and tt.num_ranks == p and tt.microbatches == m

    # Tuning measures the baseline and the candidates, and keeps the fastest as measured.
    chosen = tmp_path / "chosen.csv"
    candidates = [best, *(tmp_path / f"best.{k}.csv" for k in (2, 3))]
    out = torchrun(p, "--timetable", first, "--layers", 24, "--width", 64, "--steps", 3,
                   "--tune", *candidates, "--cost-file", costs, "--tuned-out", chosen)
    assert "| 1f1b" in out and "(best)" in out and f"wrote {chosen}" in out, out
    ratio = float(out.split("x the baseline's")[0].rsplit("(", 1)[1])
    assert ratio <= 1.0, out

    out = torchrun(p, "--timetable", chosen, "--layers", 24, "--width", 64, "--steps", 1,
                   "--warmup", 0, "--check")
    assert "gradients against one process" in out and "(equal)" in out, out


def test_tune_measures_the_candidates_and_keeps_the_fastest(tmp_path):
    # The baseline (1F1B) and the search's best and runners-up for 2 ranks, on 2 ms stages:
    # each runs in turns; what comes back is the fastest as measured, the same on every rank,
    # and the stages' gradients are as before (tuning trains nothing).
    import pipewright as pw
    from torch_launch import run_cases

    p, m = 2, 4
    base = tmp_path / "1f1b.csv"
    cli("schedule", "--schedule", "1f1b", "-p", p, "-m", m, "-o", base)
    costs = pw.Costs(2.0, 4.0)
    found = pw.search(p, m, 4, costs, time_budget=5, split_backward=False)
    paths = [str(base)]
    for k, tt in enumerate(found.timetables(3)):
        path = tmp_path / f"c{k}.csv"
        path.write_text(tt.to_csv())
        paths.append(str(path))
    case = {"kind": "tune", "name": "tune", "p": p, "timetables": paths, "steps": 3, "sleep_ms": 2.0,
            "costs": costs.to_json(stages=p, devices=p)}
    r = run_cases(p, [case], timeout=240)["tune"]
    assert r["names"][0] == "1f1b" and len(r["names"]) == len(paths)
    assert r["same_on_every_rank"] and r["grads_untouched"]
    assert r["best"] == r["names"][r["measured"].index(min(r["measured"]))]
    assert min(r["measured"]) <= r["measured"][0]
    assert all(x is not None and x > 0 for x in r["predicted"]), r["table"]
    assert "| 1f1b" in r["table"] and "(best)" in r["table"]


def test_a_step_without_target_is_refused_on_every_rank_at_once(tmp_path):
    # The rank holding the last stage forgets target=: without the check it raises and the
    # others wait for the process group's timeout; with it, every rank refuses step 0.
    from torch_launch import run_cases

    tt = tmp_path / "1f1b.csv"
    cli("schedule", "--schedule", "1f1b", "-p", 2, "-m", 4, "-o", tt)
    case = {"kind": "no_target", "name": "no_target", "p": 2, "timetable": str(tt)}
    r = run_cases(2, [case], timeout=50, pg_timeout=300)["no_target"]
    for msg in r["refusals"]:
        assert msg and "rank 1 holds the last stage" in msg and "target=" in msg, r
