"""The Python face under a new user's mistakes (issue 32): sizes bounded by the CLI's limits,
outputs that never destroy an input, calls Ctrl-C stops, titles fitted in a moment, paths as
the OS's, and every refused argument named. Cases that once aborted the interpreter run in
a subprocess each, so an abort fails one case instead of the suite."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pipewright as pw
from pipewright.torch._errors import RecordError
from pipewright.torch._outputs import inputs_of, write_output
from pipewright.torch._record import Recorder
from pipewright.torch._timetable import load


def run_case(code: str) -> dict:
    """Run `code` (which raises or not) in a fresh interpreter; what it raised, or the abort."""
    script = textwrap.dedent(
        """
        import json, math, sys
        import pipewright as pw
        nan = math.nan
        tt = pw.generate("1f1b", p=4, m=8)
        try:
            exec(sys.argv[1])
            out = {"raised": None}
        except BaseException as e:
            out = {"raised": type(e).__name__, "message": str(e),
                   "pipewright": isinstance(e, pw.PipewrightError), "type": isinstance(e, TypeError)}
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, code], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        return {"abort": done.returncode, "stderr": done.stderr[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# (code, the argument its refusal must name): out of range, wrong type, NaN and huge.
BAD_ARGUMENTS = [
    ("pw.generate('1f1b', p=-1, m=4)", "p"),
    ("pw.generate('1f1b', p=4.0, m=4)", "p"),
    ("pw.generate('1f1b', p=4, m=2**70)", "m"),
    ("pw.generate('1f1b', p=True, m=4)", "p"),
    ("pw.generate('interleaved-1f1b', p=4, m=8, v='2')", "v"),
    ("pw.simulate(tt, steps=-1)", "steps"),
    ("pw.Costs(f='x')", "f"),
    ("pw.Costs(f=nan)", "f"),
    ("pw.Costs(b=[2])", "b"),
    ("pw.Costs(p2p_latency='1')", "p2p_latency"),
    ("pw.Costs(activation_bytes=-1)", "activation_bytes"),
    ("pw.Costs().model_dict(4294967295, 1)", "stages"),
    ("pw.Costs().model_dict(-1, 1)", "stages"),
    ("pw.Costs().model_dict(4, 0)", "devices"),
    ("pw.Costs().to_json(stages=0)", "stages"),
    ("pw.Costs().to_json(stages=10**20)", "stages"),
    ("pw.Costs().to_json(stages=4, devices=70000)", "devices"),
    ("pw.search(0, 8, 4)", "p"),
    ("pw.search(4, -1, 4)", "m"),
    ("pw.search(4, 8, 4, time_budget=nan)", "time_budget"),
    ("pw.search(4, 8, 4, time_budget=1e7)", "time_budget"),
    ("pw.search(4, 8, 4, max_virtual=0)", "max_virtual"),
    ("pw.search(4, 8, 4, improve=-1)", "improve"),
    ("pw.search(2**31, 8, 4)", "p"),
    ("pw.sweep(p=0)", "p"),
    ("pw.sweep(p=4.5)", "p"),
    ("pw.sweep(m=[0])", "m"),
    ("pw.sweep(m=[-1])", "m"),
    ("pw.sweep(m='8')", "m"),
    ("pw.sweep(v=[2**33])", "v"),
    ("pw.plan(gpus=-8)", "gpus"),
    ("pw.plan(d_model=4096.0)", "d_model"),
    ("pw.plan(layers=nan)", "layers"),
    ("pw.plan(top=-1)", "top"),
    ("pw.Shape(2, 4096.0, 4, 128, 1000)", "d_model"),
    ("pw.Shape(-2, 4096, 4, 128, 1000)", "layers"),
    ("pw.Shape.from_hf_config(5)", "config"),
    ("pw.generate(schedule=5)", "schedule"),
    ("pw.search(4, 8, 4, schedules='1f1b')", "schedules"),
    ("pw.simulate(5)", "timetable"),
    ("pw.simulate(tt).chart(width=-1)", "width"),
    ("pw.simulate(tt).chart(height=2**40)", "height"),
]


def test_every_bad_argument_is_refused_naming_it_and_never_aborts():
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: run_case(case[0]), BAD_ARGUMENTS))
    wrong = []
    for (code, name), got in zip(BAD_ARGUMENTS, results):
        message = got.get("message", "")
        named = re.search(rf"(?<![\w-]){name}(?=[ :=])", message)
        kind_ok = got.get("pipewright") or got.get("type")
        if "abort" in got or not got.get("raised") or not kind_ok or not named:
            wrong.append(f"{code}: {got}")
    assert not wrong, "\n".join(wrong)


def test_a_wrong_type_is_an_argument_error_that_is_both_kinds():
    with pytest.raises(pw.ArgumentError) as e:
        pw.plan(gpus=-8)
    assert isinstance(e.value, pw.PipewrightError) and isinstance(e.value, TypeError)
    assert str(e.value) == "gpus: -8 is out of range: give a whole number from 0 to 4294967295"


def test_numpy_integers_and_floats_are_still_numbers():
    np = pytest.importorskip("numpy")
    tt = pw.generate("1f1b", p=np.int64(4), m=np.int32(8))
    assert tt.stages == 4
    assert pw.Costs(f=np.float32(1.5)).model_dict(4, 4)["stages"][0]["f"] == 1.5


# Class 1: sizes reach the core only within the CLI's limits.
def test_cost_files_are_written_only_for_stage_counts_a_reader_takes():
    got = run_case("pw.Costs().model_dict(4294967295, 1)")
    assert got.get("raised") == "PipewrightError", got
    assert "more than this machine" in got["message"], got
    with pytest.raises(pw.PipewrightError, match="stages 0"):
        pw.Costs().to_json(stages=0)
    text = pw.Costs(1.0, 2.0).to_json(stages=8, devices=4)
    assert len(json.loads(text)["stages"]) == 8
    assert pw.Costs.from_json(text).model_dict(8, 4) == pw.Costs(1.0, 2.0).model_dict(8, 4)


def test_a_sweep_past_the_clis_work_limit_is_refused_before_it_starts():
    started = time.monotonic()
    with pytest.raises(pw.PipewrightError, match="narrow m=, v= or schedules="):
        pw.sweep(m=range(1, 2001))
    assert time.monotonic() - started < 2.0


# Class 2: outputs never destroy an input; writes are whole or nothing.
class _Schedule:
    """What the recorder reads of a schedule: the timetable it was loaded from."""

    def __init__(self, path: Path):
        self.pipewright_timetable = load(path)


@pytest.fixture
def timetable_file(tmp_path) -> Path:
    path = tmp_path / "x.csv"
    path.write_text(pw.generate("1f1b", p=2, m=4).to_csv())
    return path


def test_an_output_onto_the_timetable_read_is_refused_in_every_spelling(timetable_file, tmp_path):
    before = timetable_file.read_bytes()
    inputs = inputs_of(_Schedule(timetable_file))
    link = tmp_path / "link.csv"
    link.symlink_to(timetable_file)
    hard = tmp_path / "hard.csv"
    os.link(timetable_file, hard)
    os.chdir(tmp_path)
    for spelling in [timetable_file, str(timetable_file), "./x.csv", link, hard]:
        with pytest.raises(RecordError, match="would destroy the input"):
            write_output(spelling, "{}", inputs, "save_costs")
    assert timetable_file.read_bytes() == before
    write_output(tmp_path / "costs.json", "{}\n", inputs, "save_costs")
    assert (tmp_path / "costs.json").read_text() == "{}\n"


def test_a_failed_write_names_the_users_path_and_leaves_nothing(tmp_path):
    target = tmp_path / "costs.json"
    target.mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(RecordError, match=f"save_costs {target}: cannot write") as e:
        write_output(target, "{}", [], "save_costs")
    assert ".tmp" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["costs.json"]


def test_save_costs_refuses_a_negative_skip_before_gathering():
    rec = Recorder.__new__(Recorder)  # the check comes before any collective call
    for skip in (-1, 1.5, True):
        with pytest.raises(RecordError, match="skip"):
            rec.save_costs("costs.json", skip=skip)


# Class 3: long calls stop on Ctrl-C and leave other threads running.
LONG = {
    "search": "pw.search(32, 512, 4, time_budget=60)",
    "sweep": "pw.sweep(p=4, m=list(range(1, 700)))",
}


@pytest.mark.parametrize("name", sorted(LONG))
def test_ctrl_c_stops_a_long_call_within_a_second(name):
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        import pipewright as pw
        # As an interactive interpreter has it, even when the test runs in the background.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("started", flush=True)
        try:
            {LONG[name]}
            print("finished")
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started"
    time.sleep(1.5)
    assert child.poll() is None, "the call ended before Ctrl-C: make it longer"
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    took = time.monotonic() - sent
    assert out.strip() == "interrupted"
    assert took < 1.0, f"{name} took {took:.2f} s to stop"


def test_a_sweep_leaves_other_threads_running():
    ticks = []
    worker = threading.Thread(target=lambda: pw.sweep(p=4, m=list(range(1, 300))))
    worker.start()
    while worker.is_alive():
        ticks.append(time.monotonic())
        time.sleep(0.01)
    worker.join()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 10 and max(gaps) < 0.5, f"{len(ticks)} ticks, longest gap {max(gaps):.2f} s"


# Class 4: a long title is cut in a moment.
def test_a_40000_character_title_is_fitted_in_a_moment():
    tt = pw.generate("1f1b", p=4, m=8)
    started = time.monotonic()
    chart = pw.simulate(tt).chart(title="x" * 40_000)
    assert time.monotonic() - started < 5.0
    assert "x…<" in chart.data.decode()


# Class 9: paths are the OS's, any bytes a name may hold.
def test_a_file_with_a_non_utf8_name_python_wrote_is_read_back(tmp_path):
    folder = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9"))
    folder.mkdir()
    tt = pw.generate("1f1b", p=2, m=4)
    tt.write(folder / "t.csv")
    assert pw.Timetable.read(folder / "t.csv").to_csv() == tt.to_csv()
    config = folder / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128,
        "max_position_embeddings": 32,
    }))
    assert pw.Shape.from_hf_config(str(config)).layers == 2
