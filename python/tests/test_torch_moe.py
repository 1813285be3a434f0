"""A user's mixture-of-experts stages (a router, top-2 experts, a residual) train in
PyTorch's runtime with the gradients of one process (float64, 1e-6), on the timetable `plan`
chose for an MoE model and on DualPipeV: a timetable planned for a mixture is written and run
like any other."""

from __future__ import annotations

import pytest

import pipewright.torch as pwt
from torch_launch import cli, run_cases

TOLERANCE = 1e-6
MOE = ["--layers", 8, "--d-model", 512, "--heads", 8, "--seq-len", 512, "--vocab", 8192,
       "--experts", 8, "--top-k", 2, "--expert-ffn", 1024, "--bias", "none"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    planned = tmp / "planned-moe.csv"
    cli("plan", *MOE, "--gpus", 2, "--pp", 2, "--tp", 1, "--global-batch", 8,
        "--timetable-out", planned)
    dualpipev = tmp / "dualpipev.csv"
    cli("schedule", "--schedule", "dualpipev", "-p", 2, "-v", 2, "-m", 8, "-o", dualpipev)
    cases = [{"kind": "grads", "name": path.stem, "timetable": str(path), "p": 2, "model": "moe"}
             for path in (planned, dualpipev)]
    return run_cases(2, cases, timeout=300)


@pytest.mark.parametrize("name", ["planned-moe", "dualpipev"])
def test_moe_stages_train_as_one_process(results, name):
    r = results[name]
    assert r["ranks"] == 2
    assert r["max_grad_err"] <= TOLERANCE, r


def test_the_planned_timetable_is_an_ordinary_one(results, tmp_path):
    path = tmp_path / "again.csv"
    cli("plan", *MOE, "--gpus", 2, "--pp", 2, "--tp", 1, "--global-batch", 8,
        "--timetable-out", path)
    tt = pwt.load(str(path))
    assert tt.num_ranks == 2 and tt.microbatches >= 2
