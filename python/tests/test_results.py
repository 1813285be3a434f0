"""Typed results (issue 34): the records inside `search`, `sweep`, `simulate` and `plan` results
are classes whose attributes have their documented types and equal, key for key, the dict
`to_dict()` gives (the dict these results were before, the CLI's JSON); `r["key"]` and
`r == dict` keep code written against those dicts working."""

import pytest

import pipewright as pw

GPT = dict(layers=8, d_model=512, heads=8, seq_len=512, vocab=32000, gpus=8, global_batch=64)


def same(record, expected=None):
    """Every key of `record.to_dict()` (or `expected`) is an attribute equal to its value,
    nested records compared as their dicts; `record[key]` gives the same value."""
    d = record.to_dict() if expected is None else expected
    assert isinstance(d, dict) and d
    for key, value in d.items():
        got = getattr(record, key)
        if isinstance(got, list) and got and hasattr(got[0], "to_dict"):
            got = [g.to_dict() for g in got]
        elif hasattr(got, "to_dict"):
            got = got.to_dict()
        assert got == value, (type(record).__name__, key)
        assert record[key] == value
    full = record.to_dict()
    assert record == full and record == record and record != {**full, "x": 1}
    return d


def kinds(record, **types):
    for name, t in types.items():
        value = getattr(record, name)
        assert isinstance(value, t), (type(record).__name__, name, type(value))
        # A bool is an int in Python: an int attribute must not be one.
        if t is int:
            assert not isinstance(value, bool), name


def test_search_candidates_are_typed_and_equal_their_dicts():
    found = pw.search(2, 4, 2, improve=10)
    best = found.best
    assert isinstance(best, pw.Candidate) and best == found.candidates[found.candidates.index(best)]
    for c in [best, *found.candidates, *found.front]:
        same(c)
        kinds(c, label=str, family=str, virtual_stages=int, makespan=float,
              bubble_fraction=float, period=float, bubble=pw.Bubbles, peak_microbatches=float,
              fits=bool, recomputes=int)
        assert c.peak_bytes is None or isinstance(c.peak_bytes, int)
        kinds(c.bubble, single_step=float, steady_state=float, largest_span=float)
    assert best.fits and best.label in repr(best) and "Candidate(" in repr(best)
    assert best["label"] == best.label and best.bubble["steady_state"] == best.bubble.steady_state
    with pytest.raises(KeyError, match='Candidate: no key "labels"'):
        best["labels"]
    assert found.cut_short is None and found.skipped == []


def test_search_skipped_and_cut_short_are_typed():
    # A budget of 1 us evaluates what it must and stops: cut short, with counts.
    found = pw.search(4, 8, 4, time_budget=1e-6)
    cut = found.cut_short
    assert isinstance(cut, pw.CutShort)
    same(cut)
    kinds(cut, budget_seconds=float, evaluated=int, total=int)
    assert cut.budget_seconds == 1e-6 and 0 < cut.evaluated < cut.total
    # Without split backwards, a family that splits them is skipped, with a reason.
    skipped = pw.search(2, 4, 3, schedules=["1f1b", "zb-h1"], split_backward=False,
                        list_scheduler=False).skipped
    assert skipped and all(isinstance(s, pw.Skipped) for s in skipped)
    for s in skipped:
        same(s)
        kinds(s, label=str, reason=str)


def test_search_predicted_memory_is_typed_peaks():
    shape = pw.Shape(layers=4, d_model=256, heads=4, seq_len=128, vocab=1000)
    found = pw.search(2, 4, "1GiB", shape=shape, improve=10)
    for peak in found.predicted_memory:
        same(peak)
        kinds(peak, parameters=int, gradients=int, optimizer_state=int, activations=int,
              buffers=int, workspace=int, total=int)
        assert peak.total == (peak.parameters + peak.gradients + peak.optimizer_state
                              + peak.activations + peak.buffers + peak.workspace)
    assert found.simulation.predicted_memory == found.predicted_memory


def test_sweep_bubbles_are_typed():
    rows = pw.sweep(p=2, m=[2, 4])
    for r in rows:
        assert isinstance(r.bubble, pw.Bubbles)
        same(r.bubble)
        assert r.bubble.single_step == pytest.approx(r.bubble_fraction)
        d = r.to_dict()
        assert {k: getattr(r, k) for k in d if k != "bubble"} == {
            k: v for k, v in d.items() if k != "bubble"}
        assert d["bubble"] == r.bubble.to_dict() and isinstance(r.period, float)


def test_report_devices_and_steady_bubble_are_typed():
    sim = pw.simulate(pw.generate("1f1b", p=3, m=4), pw.Costs(activation_bytes="1MiB"))
    report = sim.report.to_dict()
    devices = sim.report.devices
    assert [d.device for d in devices] == [0, 1, 2]
    for d, expected in zip(devices, report["devices"]):
        assert d.to_dict() == expected
        assert d.memory == [(s["time"], s["count"], s["bytes"]) for s in expected["memory"]]
        same(d, {k: v for k, v in expected.items() if k != "memory"})
        kinds(d, device=int, busy=float, bubble_fraction=float, peak_activations=int,
              peak_activation_bytes=int, memory=list, comm=float)
    assert devices[0].peak_activation_bytes == 3 * 2**20 and devices[0].peak_activations == 3
    steady = pw.simulate(pw.generate("zb-h1", p=2, m=4), steps=3)
    assert isinstance(steady.bubble, pw.Bubbles)
    assert steady.bubble.to_dict() == steady.to_dict()["bubble"]


def test_plan_rows_are_typed_and_equal_the_plan_json():
    plan = pw.plan(**GPT, top=2)
    rows = plan.rows
    assert rows and all(isinstance(r, pw.PlanRow) for r in rows) and rows[0] == plan.best
    for row, expected in zip(rows, plan.to_dict()["rows"]):
        assert row.to_dict() == expected
        # The plan's JSON gives memory by category without a total; the record adds it.
        memory = [{k: v for k, v in m.to_dict().items() if k != "total"} for m in row.memory]
        assert memory == expected["memory"]
        same(row, {k: v for k, v in expected.items() if k != "memory"})
        same(row.config)
        kinds(row, config=pw.PlanConfig, step_time_s=float, samples_per_s=float,
              peak_memory_bytes=int, headroom_bytes=int, bubble=float, bound_s=float)
        kinds(row.config, tp=int, pp=int, dp=int, v=int, microbatch_size=int,
              microbatches=int, schedule=str, recompute=str, recompute_devices=int, zero=int,
              sequence_parallel=bool)
        assert row.config.tp * row.config.pp * row.config.dp == GPT["gpus"]
    assert plan.best.terms is not None and "PlanRow(" in repr(plan.best)
