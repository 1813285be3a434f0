"""Golden answers of the public Python API for the requests cli/tests/golden/cases.txt gives the
CLI: each case's result, made plain JSON, must equal python/tests/golden/<case>.json (floats
within 1e-12 relative), and each refusal its stored `PipewrightError` line. This guards
restructurings (issue 34): it uses only `import pipewright`, so it must pass unchanged when
Rust code moves between crates.

`GOLDEN_BLESS=1 python -m pytest python/tests/test_golden.py` rewrites the stored answers;
review the diff before committing it. Inputs are the CLI golden inputs, read from
cli/tests/golden/ as the working directory, so messages name `inputs/...` on every machine."""

import json
import math
import os
from pathlib import Path

import pytest

import pipewright as pw

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
INPUTS_ROOT = HERE.parents[1] / "cli" / "tests" / "golden"
BLESS = os.environ.get("GOLDEN_BLESS", "") not in ("", "0")
REL_TOL = 1e-12


def _plain(x):
    """A JSON-able copy of `x` without elapsed time, which varies run to run. A result
    class or record with `to_dict` (`Candidate`, `Bubbles`, `PlanRow`, ...: issue 34's typed
    results) is compared as its dict, the dict it was before it was a class."""
    if callable(getattr(x, "to_dict", None)):
        x = x.to_dict()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _timetable(tt):
    return {"name": tt.name, "devices": tt.devices, "stages": tt.stages,
            "microbatches": tt.microbatches, "stage_device": tt.stage_device,
            "lowered": tt.lowered, "rows": tt.rows, "csv": tt.to_csv()}


def _sweep_row(r):
    keys = ["schedule", "virtual_stages", "microbatches", "makespan", "bubble_fraction",
            "period", "throughput", "peak_activations", "peak_activation_bytes", "fits",
            "error", "bubble"]
    return {k: getattr(r, k) for k in keys}


def _search(r, k=1):
    return {"best": r.best, "best_fixed": r.best_fixed, "candidates": r.candidates,
            "front": r.front, "skipped": r.skipped, "cut_short": r.cut_short,
            "cap_microbatches": r.cap_microbatches,
            "timetables": [t.to_csv() for t in r.timetables(k)]}


def _plan(p):
    d = p.to_dict()
    d["best"] = p.best
    d["parameters"] = p.parameters
    d["timetable"] = None if p.timetable is None else p.timetable.to_csv()
    return d


def _read(name):
    return pw.Timetable.read(f"inputs/{name}")


GPT = dict(layers=8, d_model=512, heads=8, seq_len=512, vocab=32000, gpus=8, global_batch=64)

# name -> the request, returning what the user reads from the answer.
CASES = {
    "generate-1f1b": lambda: _timetable(pw.generate("1f1b", p=4, m=8)),
    "generate-gpipe": lambda: _timetable(pw.generate("gpipe", p=3, m=4)),
    "generate-interleaved": lambda: {
        **_timetable(pw.generate("interleaved-1f1b", p=2, v=2, m=4)),
        "json": json.loads(pw.generate("interleaved-1f1b", p=2, v=2, m=4).to_json())},
    "generate-looped-bfs": lambda: _timetable(pw.generate("looped-bfs", p=2, v=3, m=4)),
    "generate-zb-h1": lambda: _timetable(pw.generate("zb-h1", p=4, m=6)),
    "generate-zb-h2-lowered": lambda: _timetable(pw.generate("zb-h2", p=2, m=4).lower()),
    "generate-zbv": lambda: _timetable(pw.generate("zbv", p=2, v=2, m=4)),
    "generate-dualpipev": lambda: _timetable(pw.generate("dualpipev", p=2, v=2, m=4)),
    # PyTorch's CSV has no recompute action: this one is read in pipewright's JSON.
    "generate-recompute": lambda: json.loads(
        pw.generate("1f1b", p=2, m=4, recompute="0:full,1:selective").to_json()),
    "generate-comms-csv": lambda: pw.generate(
        "interleaved-1f1b", p=2, v=2, m=4).to_csv("compute_comms"),
    "validate-good": lambda: {
        "plain": vars_of(pw.validate(_read("good.csv"))),
        "lowered": vars_of(pw.validate(_read("good.csv").lower())),
        "rendezvous": vars_of(pw.validate(_read("good.csv"), rendezvous=True))},
    "simulate-uniform": lambda: pw.simulate(
        pw.generate("interleaved-1f1b", p=4, v=2, m=8),
        pw.Costs(f=1, b=2, w=1, activation_bytes="1MiB")).report.to_dict(),
    "simulate-cost-file": lambda: pw.simulate(
        pw.generate("1f1b", p=4, m=8), pw.Costs.read("inputs/costs.json")).report.to_dict(),
    "simulate-steps": lambda: pw.simulate(pw.generate("zb-h1", p=2, m=4), steps=3).to_dict(),
    "simulate-dualpipev": lambda: pw.simulate(
        pw.generate("dualpipev", p=2, v=2, m=4),
        pw.Costs.read("inputs/costs-2.json")).report.to_dict(),
    "simulate-timeline": lambda: json.loads(pw.simulate(
        _read("good.csv"), pw.Costs(p2p_latency=0.5)).timeline.to_json()),
    "sweep": lambda: [_sweep_row(r) for r in pw.sweep(p=2, m=[2, 4, 8])],
    "sweep-cap": lambda: [_sweep_row(r) for r in pw.sweep(
        p=2, m=[4], v=[1, 2], costs=pw.Costs(activation_bytes="1MiB"), memory_cap=3)],
    "search": lambda: _search(pw.search(2, 4, 2, improve=10), k=3),
    "search-fixed": lambda: _search(pw.search(
        2, 4, 3, schedules=["1f1b", "zb-h1", "zbv"], list_scheduler=False)),
    "plan": lambda: _plan(pw.plan(**GPT, top=2)),
    "plan-hf-config": lambda: _plan(pw.plan(
        hf_config="inputs/gpt2.json", gpus=8, global_batch=64, top=3)),
    "plan-hf-llama-pp": lambda: _plan(pw.plan(
        hf_config="inputs/llama3-8b.json", gpus=16, global_batch=128, pp=2, top=3)),
    "plan-profile": lambda: _plan(pw.plan(profile="inputs/profile.json", gpus=4,
                                          global_batch=32)),
    "shape-hf-config": lambda: pw.Shape.from_hf_config("inputs/llama3-8b.json").to_dict(),
}

# name -> a refused request; the stored answer is its exception's class and message.
ERRORS = {
    "error-unknown-schedule": lambda: pw.generate("zzz"),
    "error-zero-devices": lambda: pw.generate("1f1b", p=0),
    "error-interleave-m": lambda: pw.generate("interleaved-1f1b", p=4, v=2, m=3),
    "error-bad-recompute": lambda: pw.generate("1f1b", recompute="sometimes"),
    "error-missing-file": lambda: _read("no-such.csv"),
    "error-malformed-csv": lambda: _read("malformed.csv"),
    "error-dead-timetable": lambda: pw.validate(_read_unchecked("dead.csv")),
    "error-truncated-json": lambda: pw.Costs.read("inputs/truncated.json"),
    "error-cost-without-b": lambda: pw.Costs.read("inputs/costs_no_b.json"),
    "error-bad-size": lambda: pw.Costs(activation_bytes="lots"),
    "error-search-no-fit": lambda: pw.search(2, 4, 1.5, list_scheduler=False),
    "error-plan-heads": lambda: pw.plan(**{**GPT, "d_model": 500, "heads": 7}),
}


def vars_of(validated):
    return {"compute_actions": validated.compute_actions, "lowered": validated.lowered}


def _read_unchecked(name):
    return pw.Timetable.from_csv(Path("inputs", name).read_text(), validate=False)


def _mismatch(expected, actual, where="$"):
    """Where `actual` first differs from `expected`, or None; floats within REL_TOL."""
    if isinstance(expected, float) or isinstance(actual, float):
        ok = (isinstance(expected, (int, float)) and isinstance(actual, (int, float))
              and not isinstance(expected, bool) and not isinstance(actual, bool)
              and math.isclose(expected, actual, rel_tol=REL_TOL, abs_tol=1e-300))
        return None if ok else f"{where}: expected {expected!r}, got {actual!r}"
    if isinstance(expected, dict) and isinstance(actual, dict):
        if sorted(expected) != sorted(actual):
            return f"{where}: keys {sorted(expected)} != {sorted(actual)}"
        for k in expected:
            m = _mismatch(expected[k], actual[k], f"{where}.{k}")
            if m:
                return m
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{where}: {len(expected)} items expected, got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            m = _mismatch(e, a, f"{where}[{i}]")
            if m:
                return m
        return None
    if type(expected) is not type(actual) or expected != actual:
        return f"{where}: expected {expected!r}, got {actual!r}"
    return None


def _check(name, actual):
    path = GOLDEN / f"{name}.json"
    if BLESS:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"{path} missing: run with GOLDEN_BLESS=1 to write it"
    expected = json.loads(path.read_text())
    m = _mismatch(expected, actual)
    assert m is None, f"case `{name}` ({path.name}) differs at {m}"


@pytest.fixture(autouse=True)
def _in_inputs_root(monkeypatch):
    monkeypatch.chdir(INPUTS_ROOT)


@pytest.mark.parametrize("name", sorted(CASES))
def test_answer_matches_golden(name):
    # A JSON round trip makes tuples lists and checks the answer is plain data.
    _check(name, json.loads(json.dumps(_plain(CASES[name]()))))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_refusal_matches_golden(name):
    with pytest.raises(pw.PipewrightError) as e:
        ERRORS[name]()
    message = str(e.value)
    assert "\n" not in message, message
    _check(name, {"class": type(e.value).__name__, "message": message})


def test_no_stale_golden_files():
    names = set(CASES) | set(ERRORS)
    stale = sorted(p.name for p in GOLDEN.glob("*.json") if p.stem not in names)
    if BLESS:
        for s in stale:
            (GOLDEN / s).unlink()
        return
    assert not stale, f"golden answers of no case: {stale}"


def test_mismatch_finds_a_changed_float_and_tolerates_rounding():
    assert _mismatch({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-14)]}) is None
    assert _mismatch({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-9)]}) == (
        f"$.a[1]: expected 2.0, got {2.0 * (1 + 1e-9)!r}")
    assert _mismatch({"a": 1}, {"a": True}) is not None
    assert _mismatch({"a": "x"}, {"a": "y"}) == "$.a: expected 'x', got 'y'"
