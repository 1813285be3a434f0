"""pipewright.torch reads pipewright's timetables as PyTorch's runtime will run them, and refuses
what it cannot run in one line, before any process group or stage is touched."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pipewright
import pipewright.torch as pwt
from torch_launch import cli


def written(tmp_path: Path, name: str, *flags: str) -> Path:
    out = tmp_path / f"{name}.csv"
    cli("schedule", *flags, "-o", out)
    return out


def csv_file(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_loop_placement_puts_stage_s_on_rank_s_mod_p(tmp_path):
    tt = pwt.load(written(tmp_path, "i", "--schedule", "interleaved-1f1b", "-p", "4", "-v", "2", "-m", "8"))
    assert (tt.num_ranks, tt.num_stages, tt.microbatches, tt.form) == (4, 8, 8, "compute_only")
    assert tt.placement == "loop"
    assert [tt.stages_of(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    one = pwt.load(written(tmp_path, "1", "--schedule", "1f1b", "-p", "4", "-m", "6"))
    assert pwt.stage_ranks(one) == [0, 1, 2, 3] and one.microbatches == 6


@pytest.mark.parametrize("family", ["zbv", "dualpipev"])
def test_v_placement_puts_stages_r_and_2p_minus_1_minus_r_on_rank_r(tmp_path, family):
    tt = pwt.load(written(tmp_path, family, "--schedule", family, "-p", "4", "-v", "2", "-m", "8"))
    assert tt.placement == "v"
    assert pwt.stage_ranks(tt) == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [tt.stages_of(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]


def test_dualpipev_overlaps_are_read_with_both_parts(tmp_path):
    tt = pwt.load(written(tmp_path, "d", "--schedule", "dualpipev", "-p", "2", "-v", "2", "-m", "4"))
    overlaps = [c for row in tt.rows for c in row if c.endswith("OVERLAP_F_B")]
    assert overlaps and all(c.startswith("(") for c in overlaps)
    assert tt.microbatches == 4  # the last forwards sit inside overlaps


def test_a_recompute_is_refused_naming_the_file_and_what_to_do(tmp_path):
    path = csv_file(tmp_path, "0F0,0R0,0B0\n")
    with pytest.raises(pwt.TimetableError) as e:
        pwt.load(path)
    msg = one_line(e)
    assert msg.startswith(f"{path}: 1 recompute action (0R0) on stage 0"), msg
    assert "activation checkpointing (torch.utils.checkpoint)" in msg
    # pipewright's own writer refuses it too, in the same words.
    done = cli("schedule", "--schedule", "1f1b", "-p", "2", "-m", "2", "--recompute", "full",
               "-o", tmp_path / "r.csv", check=False)
    assert done.returncode != 0 and "recompute action" in done.stderr
    assert not (tmp_path / "r.csv").exists()


def test_bad_files_are_refused_in_one_line_with_pipewrights_words(tmp_path):
    cases = {
        "0F0,0X0\n": "line 1, column 5: `0X0` has no known action kind",
        "0F0,0B0\n0F1,0B1\n": "stage 0 is already on device 0",
        "0F0,0B0\n\n1F0,1B0\n": "line 2 is blank",
        "": "no actions",
        "(0F0;0F1)OVERLAP_F_B\n": "is not an overlap",
        "0F0\n": "",  # no backward: pipewright's validator names what is missing
    }
    for text, want in cases.items():
        path = csv_file(tmp_path, text)
        with pytest.raises(pwt.TimetableError) as e:
            pwt.load(path)
        assert one_line(e).startswith(str(path)) and want in str(e.value), (text, str(e.value))
    with pytest.raises(pwt.TimetableError) as e:
        pwt.load(tmp_path / "missing.csv")
    assert "cannot read" in one_line(e)
    (tmp_path / "bin.csv").write_bytes(b"0F0,\xff\xfe")
    with pytest.raises(pwt.TimetableError) as e:
        pwt.load(tmp_path / "bin.csv")
    assert "not UTF-8 at byte 4" in one_line(e)
    with pytest.raises(pwt.TimetableError) as e:
        pwt.load(42)
    assert "cannot read a timetable from int" in one_line(e)
    with pytest.raises(pwt.TimetableError) as e:
        pwt.load(tmp_path / "bin.csv", form="lowered")
    assert "is not one of PyTorch's" in one_line(e)
    # They are pipewright's errors too: one except catches the engine's and the runner's.
    assert issubclass(pwt.TorchError, pipewright.PipewrightError)


def test_every_form_and_object_gives_pytorch_the_same_rows(tmp_path):
    path = written(tmp_path, "z", "--schedule", "zbv", "-p", "2", "-v", "2", "-m", "4")
    from_csv = pwt.load(path)
    native = pipewright.Timetable.read(path)
    lowered = csv_file(tmp_path, native.to_csv("lowered"), "lowered.csv")
    for other in (native, lowered, pipewright.generate("zbv", p=2, v=2, m=4)):
        tt = pwt.load(other)
        assert (tt.rows, tt.stage_rank, tt.form) == (from_csv.rows, from_csv.stage_rank, "compute_only")
    comms = pwt.load(native, form="compute_comms")
    assert comms.form == "compute_comms" and any("WAIT_SEND_F" in c for c in comms.rows[0])
    assert comms.unscaled_stage() is None  # pipewright writes PyTorch's REDUCE_GRADs


def test_a_compute_comms_timetable_must_scale_every_stage(tmp_path):
    """PyTorch scales gradients by 1/m only in REDUCE_GRAD: without it they come out m times
    too large, silently, so the runner refuses it."""
    rows = (
        "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,{r0}\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,{r1}1WAIT_SEND_B0\n"
    )
    good = rows.format(r0="0REDUCE_GRAD,0WAIT_REDUCE_GRAD", r1="1REDUCE_GRAD,1WAIT_REDUCE_GRAD,")
    tt = pwt.load(csv_file(tmp_path, good, "good.csv"))
    assert tt.form == "compute_comms" and tt.unscaled_stage() is None
    bad = pwt.load(csv_file(tmp_path, rows.format(r0="0REDUCE_GRAD,0WAIT_REDUCE_GRAD", r1=""), "bad.csv"))
    assert "stage 1 has no 1REDUCE_GRAD" in bad.unscaled_stage()
    early = "0F0,0SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RECV_B0,0B0,0WAIT_SEND_F0\n" + rows.split("\n")[1].format(r1="1REDUCE_GRAD,1WAIT_REDUCE_GRAD,") + "\n"
    assert "comes before stage 0's last backward" in pwt.load(csv_file(tmp_path, early, "early.csv")).unscaled_stage()
    # Asked for compute-only, it gives PyTorch the compute order and lets PyTorch lower it.
    plain = pwt.load(csv_file(tmp_path, good, "x.csv"), form="compute_only")
    assert plain.rows == (("0F0", "0B0"), ("1F0", "1B0")) and plain.form == "compute_only"


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
        timeout=timedelta(seconds=30),
    )
    yield
    dist.destroy_process_group()


def test_stages_that_do_not_match_the_timetable_are_refused(tmp_path, world_of_one):
    # One rank holding two stages (loop placement, v = 2).
    tt = pwt.load(csv_file(tmp_path, "0F0,1F0,1B0,0B0\n"))
    stages = pwt.pipeline_stages(tt, lambda s: torch.nn.Linear(2, 2))
    assert [st.stage_index for st in stages] == [0, 1]
    with pytest.raises(pwt.StageError) as e:
        pwt.schedule(tt, stages[:1])
    assert "rank 0 holds stages [0, 1]" in one_line(e) and "given stages [0]" in str(e.value)
    two_ranks = pwt.load(csv_file(tmp_path, "0F0,0B0\n1F0,1B0\n", "two.csv"))
    with pytest.raises(pwt.StageError) as e:
        pwt.pipeline_stages(two_ranks, lambda s: torch.nn.Linear(2, 2))
    assert "has 2 ranks (one row each), but the pipeline group has 1 processes" in one_line(e)
    with pytest.raises(pwt.StageError) as e:
        pwt.pipeline_stages(tt, [torch.nn.Linear(2, 2)])
    assert "1 modules given for a timetable of 2 stages" in one_line(e)
    with pytest.raises(pwt.StageError) as e:
        pwt.pipeline_stages(tt, {0: torch.nn.Linear(2, 2)})
    assert "no module for stage 1" in one_line(e)
    sched = pwt.schedule(tt, stages, loss_fn=torch.nn.functional.mse_loss)
    x = torch.randn(2, 2)
    sched.step(x, target=torch.randn(2, 2))  # one rank, two stages: it runs
    assert all(p.grad is not None for st in stages for p in st.submod.parameters())


def test_a_schedule_that_runs_its_own_loop_cannot_be_recorded(world_of_one):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    stage = PipelineStage(torch.nn.Linear(2, 2), 0, 1, torch.device("cpu"))
    with pytest.raises(pwt.RecordError) as e:
        pwt.Recorder(Schedule1F1B(stage, 2, loss_fn=torch.nn.functional.mse_loss))
    msg = one_line(e)
    assert msg.startswith("Schedule1F1B runs its own loop") and "pipewright schedule" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the CUDA-event clock is not exercised")
def test_the_recorder_times_a_gpu_with_cuda_events(tmp_path, world_of_one):
    """One rank, two stages on cuda:0 (a local hand-off, no transfer): the recorder's clock is
    CUDA events, and the step's events come out ordered and inside the step."""
    tt = pwt.load(csv_file(tmp_path, "0F0,1F0,0F1,1F1,1B0,0B0,1B1,0B1\n"))
    dev = torch.device("cuda", 0)
    stages = pwt.pipeline_stages(
        tt, lambda s: torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()).to(dev), device=dev)
    sched = pwt.schedule(tt, stages, loss_fn=torch.nn.functional.mse_loss)
    rec = pwt.Recorder(sched)
    x, y = torch.randn(8, 64, device=dev), torch.randn(8, 64, device=dev)
    for _ in range(3):
        rec.step(x, target=y)
    tls = rec.timelines()
    assert len(tls) == 3
    events = json.loads(tls[-1].to_json())["events"]
    assert len(events) == 8 and all(e["action"]["kind"] in "FB" for e in events)
    ordered = sorted(events, key=lambda e: e["start"])
    assert ordered[0]["start"] == 0.0
    assert all(a["end"] <= b["start"] + 1e-3 for a, b in zip(ordered, ordered[1:]))
    assert all(e["end"] > e["start"] for e in events)
