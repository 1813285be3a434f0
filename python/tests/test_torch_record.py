"""The recorder turns real PyTorch steps into pipewright timelines that the CLI checks and draws,
with one event per action of the timetable, in causal order across ranks, and into a cost
file that `simulate` and `search` read; PyTorch's own schedule classes are recorded as they
are. One launch of 4 processes records all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pipewright.torch as pwt
from torch_launch import cli, run_cases

SLEEP_MS = 2.0  # each stage sleeps this long in its forward and in its backward
# PyTorch's own schedule classes, recorded as they are (2 ranks, 2 stages each, m = 4).
TORCH_CLASSES = {"ScheduleInterleaved1F1B": "loop", "ScheduleDualPipeV": "v"}
RECORDED = {
    "1f1b": ("1f1b", 2, 1, 4),
    "dualpipev": ("dualpipev", 2, 2, 4),
    "zbv": ("zbv", 4, 2, 8),
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("record")
    cases = []
    for name, (family, p, v, m) in RECORDED.items():
        out = tmp / name
        out.mkdir()
        csv = out / f"{name}.csv"
        cli("schedule", "--schedule", family, "-p", p, "-v", v, "-m", m, "-o", csv)
        cases.append({"kind": "record", "name": name, "timetable": str(csv), "p": p,
                      "out_dir": str(out), "steps": 3, "warmup": 1, "sleep_ms": SLEEP_MS,
                      "probe": name in ("1f1b", "zbv")})
    for cls, placement in TORCH_CLASSES.items():
        out = tmp / cls
        out.mkdir()
        cases.append({"kind": "record_torch", "name": cls, "class": cls, "placement": placement,
                      "p": 2, "m": 4, "out_dir": str(out), "sleep_ms": SLEEP_MS})
    results = run_cases(4, cases, timeout=300)
    recorded = {name: (Path(c["out_dir"]), Path(c["timetable"]), results[name]) for name, c in
                zip(RECORDED, cases)}
    for c in cases[len(RECORDED):]:
        recorded[c["name"]] = (Path(c["out_dir"]), Path(c["out_dir"]) / "torch.csv", results[c["name"]])
    return recorded


def expected_compute(tt: pwt.TorchTimetable) -> list:
    """(device, action) of every compute action of the timetable, as the timeline writes it."""
    out = []
    for rank, row in enumerate(tt.rows):
        for cell in row:
            if cell.startswith("("):
                f, b = cell[1 : cell.index(")")].split(";")
                fs, fm = f.split("F")
                bs, bm = b.split("B")
                kind = {"OVERLAP_F_B": {"b_stage": int(bs), "b_microbatch": int(bm)}}
                out.append((rank, int(fs), json.dumps(kind), int(fm)))
            else:
                for k in "FBIW":
                    if k in cell:
                        s, m = cell.split(k)
                        out.append((rank, int(s), json.dumps(k), int(m)))
    return sorted(out)


def compute_events(tl: dict) -> list:
    return [e for e in tl["events"] if not (isinstance(e["action"]["kind"], str)
                                            and e["action"]["kind"].startswith(("SEND", "RECV")))]


@pytest.mark.parametrize("name", list(RECORDED))
def test_every_action_is_one_event_on_its_rank(recorded, name):
    out, csv, result = recorded[name]
    tt = pwt.load(csv)
    assert result["steps"] == 3
    for k in range(3):
        tl = json.loads((out / f"step{k}.json").read_text())
        assert tl["meta"] == {"schedule": name, "devices": tt.num_ranks, "stages": tt.num_stages,
                              "microbatches": tt.microbatches, "source": "measured", "time_unit": "ms"}
        got = sorted((e["device"], e["action"]["stage"], json.dumps(e["action"]["kind"]),
                      e["action"]["microbatch"]) for e in compute_events(tl))
        assert got == expected_compute(tt)
        assert min(e["start"] for e in tl["events"]) == 0.0
        for dev in range(tt.num_ranks):
            mine = sorted((e for e in compute_events(tl) if e["device"] == dev), key=lambda e: e["start"])
            assert all(e["end"] >= e["start"] for e in mine)
            # One CPU thread per rank: its compute never overlaps itself.
            assert all(a["end"] <= b["start"] for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("name", list(RECORDED))
def test_ranks_share_one_clock_so_hand_offs_are_causal(recorded, name):
    """A stage's forward starts after the previous stage's forward of that microbatch ended,
    on whichever rank each ran: the ranks' clocks are aligned."""
    out, csv, _ = recorded[name]
    tt = pwt.load(csv)
    tl = json.loads((out / "timeline.json").read_text())
    f_end, f_start, b_end, b_start = {}, {}, {}, {}
    for e in compute_events(tl):
        a, kind = e["action"], e["action"]["kind"]
        # An overlap's event starts with its F; its B's own start is not in the timeline.
        parts = [("F", a["stage"], a["microbatch"])]
        if not isinstance(kind, dict) and kind != "F":
            parts = [(kind, a["stage"], a["microbatch"])]
        for k, s, m in parts:
            if k == "F":
                f_start[(s, m)], f_end[(s, m)] = e["start"], e["end"]
            elif k in ("B", "I"):
                b_start[(s, m)], b_end[(s, m)] = e["start"], e["end"]
    crossings = 0
    for (s, m), start in f_start.items():
        if s > 0 and tt.stage_rank[s] != tt.stage_rank[s - 1]:
            crossings += 1
            assert start >= f_end[(s - 1, m)] - 0.05, (s, m)  # overlap halves: within 50 us
    for (s, m), start in b_start.items():
        if s < tt.num_stages - 1 and tt.stage_rank[s] != tt.stage_rank[s + 1]:
            assert start >= b_end[(s + 1, m)] - 0.05, (s, m)
    assert crossings > 0
    recvs = [e for e in tl["events"] if e["action"]["kind"] in ("RECV_F", "RECV_B")]
    sends = [e for e in tl["events"] if e["action"]["kind"] in ("SEND_F", "SEND_B")]
    assert len(recvs) == len(sends) > 0


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_cli_checks_and_draws_the_recorded_step(recorded, name):
    out, _, _ = recorded[name]
    chart = out / "chart.svg"
    cli("viz", "--from", out / "timeline.json", "-o", chart)
    assert chart.read_text().lstrip().startswith("<svg")
    term = cli("viz", "--from", out / "timeline.json").stdout
    assert "measured" in term and "ms" in term


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_cost_file_holds_the_measured_stage_times(recorded, name):
    out, csv, _ = recorded[name]
    tt = pwt.load(csv)
    costs = json.loads((out / "costs.json").read_text())
    assert costs["time_unit"] == "ms" and len(costs["stages"]) == tt.num_stages
    assert costs["source"].startswith(f"measured: {name} on {tt.num_ranks} devices")
    for s, c in enumerate(costs["stages"]):
        assert c["f"] >= SLEEP_MS, (s, c)  # a forward cannot take less than its sleep
        backward = c.get("b", c.get("i", 0) + c.get("w", 0))
        assert backward >= SLEEP_MS, (s, c)
    if name == "zbv":  # a split backward is measured split
        assert all("i" in c and "w" in c for c in costs["stages"])
    # Every rank waits for its first input: the hand-off latency is measured, and simulate
    # adds it to each hand-off between ranks.
    assert costs["p2p_latency"] >= 0 and "hand-offs a device waited for" in costs["source"]
    simulated = lambda *more: json.loads(cli(
        "simulate", "--timetable", csv, "--cost-file", out / "costs.json", "--format", "json",
        *more).stdout)["makespan"]
    compute_only = simulated("--p2p-latency", 0)
    assert 0 < compute_only <= simulated()  # a later hand-off never makes a step shorter
    assert simulated() == pytest.approx(simulated("--p2p-latency", costs["p2p_latency"]))


@pytest.mark.parametrize("cls", list(TORCH_CLASSES))
def test_pytorchs_own_schedules_are_recorded_as_they_run(recorded, cls):
    """A run that uses PyTorch's own schedule class, unchanged, measures for `search` too."""
    out, dumped, _ = recorded[cls]
    tt = pwt.load(dumped)  # PyTorch's own rows, as it dumps them, read by pipewright
    tl = json.loads((out / "timeline.json").read_text())
    assert tl["meta"]["schedule"] == cls and tl["meta"]["stages"] == 4
    got = sorted((e["device"], e["action"]["stage"], json.dumps(e["action"]["kind"]),
                  e["action"]["microbatch"]) for e in compute_events(tl))
    assert got == expected_compute(tt)
    cli("viz", "--from", out / "timeline.json", "-o", out / "chart.svg")
    costs = json.loads((out / "costs.json").read_text())
    assert all(c["f"] >= SLEEP_MS for c in costs["stages"])
    found = cli("search", "-p", 2, "-m", 4, "--cost-file", out / "costs.json", "--memory-cap", 2,
                "--time-budget", 10, "--timetable-out", out / "best.csv").stdout
    assert "best:" in found and pwt.load(out / "best.csv").num_ranks == 2


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_cost_file_holds_the_host_time_of_pytorchs_runtime(recorded, name):
    out, csv, _ = recorded[name]
    costs = json.loads((out / "costs.json").read_text())
    host = costs["host"]
    assert host["runtime"] == "pytorch"
    # Every rank posts sends and receives; posting takes time, and no more than a step.
    step = json.loads((out / "step0.json").read_text())
    span = max(e["end"] for e in step["events"]) - min(e["start"] for e in step["events"])
    for what in ("action", "send", "recv", "other"):
        assert 0 <= host[what] < span, (what, host)
    assert host["send"] > 0 and host["recv"] > 0, host
    # simulate charges it: the same costs with no host time predict a shorter step.
    simulated = lambda cost: json.loads(cli(
        "simulate", "--timetable", csv, "--cost-file", cost, "--format", "json").stdout)["makespan"]
    bare = out / "bare.json"
    bare.write_text(json.dumps(dict(costs, host={"runtime": "pytorch"})))
    assert simulated(bare) < simulated(out / "costs.json")


def test_the_split_probe_measures_i_and_w_beside_b_and_trains_nothing(recorded):
    out, csv, result = recorded["1f1b"]
    costs = json.loads((out / "costs.json").read_text())
    assert result["probe_kept_grads"] is True
    for s, c in enumerate(costs["stages"]):
        assert {"b", "i", "w"} <= set(c), (s, c)
        assert c["i"] + c["w"] >= SLEEP_MS, (s, c)  # the stage's sleep is in its backward
    assert "the other backward from 2 steps of 1f1b split probe" in costs["source"]
    # A split recording (zbv) is probed the other way: B fused in place of each I.
    zbv = json.loads((recorded["zbv"][0] / "costs.json").read_text())
    assert all({"b", "i", "w"} <= set(c) for c in zbv["stages"]), zbv
    assert "zbv fused probe" in zbv["source"]
    # search reads the file, and can be told not to split.
    found = cli("search", "-p", 2, "-m", 4, "--cost-file", out / "costs.json", "--memory-cap", 4,
                "--no-split-backward", "--format", "json").stdout
    assert json.loads(found)["best"]["family"] in ("1f1b", "gpipe", "interleaved-1f1b",
                                                    "looped-bfs", "list")


def test_data_parallel_replicas_never_race_on_one_file(tmp_path):
    # Two pipelines of 2 ranks save costs to one path: one writes it, the other is refused,
    # naming the replica that wrote it; with {replica} in the path each writes its own file.
    from torch_launch import run_cases

    csv = tmp_path / "1f1b.csv"
    cli("schedule", "--schedule", "1f1b", "-p", 2, "-m", 4, "-o", csv)
    case = {"kind": "dp_record", "name": "dp", "p": 4, "timetable": str(csv),
            "out_dir": str(tmp_path)}
    refusals = run_cases(4, [case], timeout=120)["dp"]["refusals"]
    said = [r for r in refusals if r]
    assert len(said) == 1 and "wrote this file in this run" in said[0], refusals
    assert said[0].startswith("save_costs") and "{replica}" in said[0]
    assert refusals.index(said[0]) in (0, 2)  # a pipeline's writing rank
    json.loads((tmp_path / "costs.json").read_text())  # whole, from the one that wrote it
    for replica in (0, 2):
        assert (tmp_path / f"costs.{replica}.json").is_file()
