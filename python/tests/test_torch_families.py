"""Every timetable pipewright writes trains in PyTorch's `_PipelineScheduleRuntime` with the
gradients of one process (float64, 1e-6): every generator family at p = 2 and 4 (v = 2 where
it applies), DualPipeV's overlapped F&B, a searched timetable with I/W in V placement, and
a planned one (`plan --timetable-out`), and the compute+comms form. One launch of 4 processes (gloo, CPU) runs all of them; a case of 2
ranks runs on the first two."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipewright.torch as pwt
from torch_launch import cli, run_cases

FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zbv", "dualpipev"]
VIRTUAL = {"interleaved-1f1b", "looped-bfs", "zbv", "dualpipev"}
TOLERANCE = 1e-6


def family_cases(tmp: Path) -> list[dict]:
    cases = []
    for family in FAMILIES:
        for p in (2, 4):
            v = 2 if family in VIRTUAL else 1
            path = tmp / f"{family}-p{p}.csv"
            cli("schedule", "--schedule", family, "-p", p, "-v", v, "-m", 8, "-o", path)
            cases.append({"kind": "grads", "name": path.stem, "timetable": str(path), "p": p})
    return cases


def searched_case(tmp: Path) -> dict:
    """The search's own list scheduler, two chunks per rank in a V, I and W split."""
    path = tmp / "searched.csv"
    cli("search", "-p", 4, "-m", 8, "--memory-cap", 3, "--cost", "1,2,1", "--max-virtual", 2,
        "--time-budget", 20, "--timetable-out", path)
    return {"kind": "grads", "name": "searched", "timetable": str(path), "p": 4}


def planned_case(tmp: Path) -> dict:
    """`plan --timetable-out` for a small GPT on 4 GPUs in a pipeline of 4."""
    path = tmp / "planned.csv"
    cli("plan", "--layers", 8, "--d-model", 512, "--heads", 8, "--seq-len", 512, "--vocab", 8192,
        "--gpus", 4, "--pp", 4, "--tp", 1, "--global-batch", 16, "--timetable-out", path)
    return {"kind": "grads", "name": "planned", "timetable": str(path), "p": 4}


def comms_cases(tmp: Path) -> list[dict]:
    """PyTorch's compute+comms form, waits included, as pipewright writes it."""
    cases = []
    for family, p, v in [("1f1b", 4, 1), ("interleaved-1f1b", 2, 2), ("zbv", 2, 2), ("dualpipev", 4, 2)]:
        path = tmp / f"{family}-p{p}-comms.csv"
        cli("schedule", "--schedule", family, "-p", p, "-v", v, "-m", 8, "--format", "csv",
            "--comms", "-o", path)
        cases.append({"kind": "grads", "name": path.stem, "timetable": str(path), "p": p,
                      "form": "compute_comms"})
    return cases


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("families")
    cases = family_cases(tmp) + [searched_case(tmp), planned_case(tmp)] + comms_cases(tmp)
    return {"cases": {c["name"]: c for c in cases}, "results": run_cases(4, cases, timeout=400)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("p", [2, 4])
def test_every_family_trains_as_one_process(results, family, p):
    r = results["results"][f"{family}-p{p}"]
    v = 2 if family in VIRTUAL else 1
    assert (r["ranks"], r["stages"]) == (p, p * v)
    assert r["max_grad_err"] <= TOLERANCE, r


def test_dualpipev_runs_its_overlapped_f_and_b(results):
    for p in (2, 4):
        case = results["cases"][f"dualpipev-p{p}"]
        tt = pwt.load(case["timetable"])
        assert any(c.endswith("OVERLAP_F_B") for row in tt.rows for c in row)
        assert results["results"][case["name"]]["max_grad_err"] <= TOLERANCE


def test_a_searched_timetable_with_i_w_in_v_placement_trains_as_one_process(results):
    tt = pwt.load(results["cases"]["searched"]["timetable"])
    cells = [c for row in tt.rows for c in row]
    assert tt.placement == "v" and tt.num_stages == 8, tt.stage_rank
    assert any("I" in c for c in cells) and any("W" in c for c in cells)
    assert tt.form == "compute_only"
    assert results["results"]["searched"]["max_grad_err"] <= TOLERANCE


def test_a_planned_timetable_trains_as_one_process(results):
    tt = pwt.load(results["cases"]["planned"]["timetable"])
    assert tt.num_ranks == 4 and tt.num_stages >= 4
    assert results["results"]["planned"]["max_grad_err"] <= TOLERANCE


def test_the_compute_comms_form_loads_and_gives_the_same_gradients(results):
    names = [n for n in results["cases"] if n.endswith("-comms")]
    assert len(names) == 4
    for name in names:
        tt = pwt.load(results["cases"][name]["timetable"], form="compute_comms")
        assert tt.form == "compute_comms"
        assert any("WAIT_SEND" in c for row in tt.rows for c in row)
        assert results["results"][name]["max_grad_err"] <= TOLERANCE, name
