"""PyTorch's pipelining reads both CSV forms pipewright writes, exactly.

For every generator family, a searched timetable and DualPipeV's overlaps: the compute-only
form loads with `_PipelineScheduleRuntime._load_csv(path)`, and the compute+comms form is
cell for cell what PyTorch's own lowering of it dumps, and loads with
`format="compute_comms"`. Loading needs no process group: a stage only has to say its
stage count, group size and rank. (Training with these files, gradients against one
process, is `pipewright.torch`'s suite.)
"""

import csv
import io
import types

import pytest
import torch  # noqa: F401  (CI installs PyTorch; a missing one fails here, it is not skipped)
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

import pipewright as pw

FAMILIES = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("looped-bfs", 2),
    ("zb-h1", 1),
    ("zb-h2", 1),
    ("zbv", 2),
    ("dualpipev", 2),
]


def runtime(tt: pw.Timetable) -> _PipelineScheduleRuntime:
    stage = types.SimpleNamespace(
        num_stages=tt.stages, group_size=tt.devices, group_rank=0, stage_index=0
    )
    return _PipelineScheduleRuntime([stage], n_microbatches=tt.microbatches)


def load(tt: pw.Timetable, text: str, fmt: str, tmp_path) -> _PipelineScheduleRuntime:
    path = tmp_path / f"{fmt}.csv"
    path.write_text(text)
    sched = runtime(tt)
    sched._load_csv(str(path), format=fmt)
    return sched


def dumped_rows(sched: _PipelineScheduleRuntime, tmp_path) -> list:
    out = tmp_path / "dump.csv"
    sched._dump_csv(str(out), format="compute_comms")
    return list(csv.reader(io.StringIO(out.read_text())))


def check_both_forms(tt: pw.Timetable, tmp_path):
    sched = load(tt, tt.to_csv(), "compute_only", tmp_path)
    ours = tt.to_csv("compute_comms")
    # Cell for cell what PyTorch's own lowering makes of the compute-only form.
    assert list(csv.reader(io.StringIO(ours))) == dumped_rows(sched, tmp_path)
    # And PyTorch takes it as it is.
    sched = load(tt, ours, "compute_comms", tmp_path)
    assert list(csv.reader(io.StringIO(ours))) == dumped_rows(sched, tmp_path)
    # The stage-to-rank map PyTorch infers is pipewright's placement.
    assert [sched.stage_index_to_group_rank[s] for s in range(tt.stages)] == tt.stage_device


@pytest.mark.parametrize("family,v", FAMILIES)
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [8, 16])
def test_every_family_loads_in_pytorch_in_both_forms(family, v, p, m, tmp_path):
    check_both_forms(pw.generate(family, p=p, v=v, m=m), tmp_path)


def test_a_searched_timetable_with_split_backward_and_v_placement_loads(tmp_path):
    found = pw.search(4, 8, memory_cap=4, time_budget=10, schedules=["1f1b"], max_virtual=2)
    tt = found.timetable
    assert any("I" in a for row in tt.rows for a in row), tt.rows
    check_both_forms(tt, tmp_path)
    # Lowered or not, the written forms are the same.
    assert tt.lower().to_csv() == tt.to_csv()
    assert tt.lower().to_csv("compute_comms") == tt.to_csv("compute_comms")


def test_dualpipev_overlaps_are_written_as_pytorch_spells_them(tmp_path):
    tt = pw.generate("dualpipev", p=4, v=2, m=8)
    text = tt.to_csv()
    assert ")OVERLAP_F_B" in text
    check_both_forms(tt, tmp_path)


def test_pytorch_refuses_pipewrights_own_lowered_rows_which_is_why_csv_is_never_them(tmp_path):
    tt = pw.generate("1f1b", p=2, m=4)
    with pytest.raises(ValueError, match="Expected compute-only schedule"):
        load(tt, tt.lower().to_csv("lowered"), "compute_only", tmp_path)


def test_recomputation_has_no_pytorch_form():
    tt = pw.generate("1f1b", p=2, m=2, recompute="full")
    for form in ["compute_only", "compute_comms"]:
        with pytest.raises(pw.PipewrightError, match="activation checkpointing"):
            tt.to_csv(form)
    # pipewright's own forms keep it.
    assert pw.Timetable.from_json(tt.to_json()) == tt
