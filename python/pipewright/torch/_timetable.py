"""A timetable as PyTorch's runtime reads it: one row of action strings per rank.

pipewright (the native package) reads and validates the timetable and writes it in PyTorch's
CSV forms (compute-only, and compute+comms with its waits), refusing what PyTorch cannot run
(recomputation) in one line. This module adds what building the stages needs: which rank holds
which stage, each cell checked by PyTorch's own parser, and a check that PyTorch will scale the
gradients of a compute+comms file. Nothing here touches a process group or a stage.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipewright

from ._errors import TimetableError

_STAGE_KIND = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")

COMPUTE_ONLY = "compute_only"
COMPUTE_COMMS = "compute_comms"


@dataclass(frozen=True)
class TorchTimetable:
    """A timetable in one of PyTorch's CSV forms, checked, with what the stages need.

    `rows[r]` is rank r's actions as PyTorch writes them (`0F0`, `(2F5;9B3)OVERLAP_F_B`,
    `1SEND_F0`); `stage_rank[s]` is the rank that holds stage s (loop placement: `s % p`;
    V placement: `s` and `2p - 1 - s` on rank `s`).
    """

    rows: tuple[tuple[str, ...], ...]
    form: str
    num_stages: int
    microbatches: int
    stage_rank: tuple[int, ...]
    name: str
    source: str

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks `p`: one row each."""
        return len(self.rows)

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank `rank` holds, in increasing order."""
        if not 0 <= rank < self.num_ranks:
            raise TimetableError(
                f"{self.source}: rank {rank} is out of range; the timetable has "
                f"{self.num_ranks} ranks"
            )
        return [s for s, r in enumerate(self.stage_rank) if r == rank]

    @property
    def placement(self) -> str:
        """`loop`, `v`, or `custom` for any other map."""
        p, stages = self.num_ranks, self.num_stages
        if all(r == s % p for s, r in enumerate(self.stage_rank)):
            return "loop"
        v_map = [s if s < p else 2 * p - 1 - s for s in range(stages)]
        if stages == 2 * p and list(self.stage_rank) == v_map:
            return "v"
        return "custom"

    def unscaled_stage(self) -> str | None:
        """In the compute+comms form: why a stage's gradients would miss PyTorch's `1/m`.

        PyTorch scales a stage's accumulated gradients (`scale_grads=True`) only in its
        `REDUCE_GRAD`, which the compute+comms form must hold after the stage's last backward
        (PyTorch adds it itself when it lowers a compute-only timetable). Returns one line
        naming the first stage without one, or None.
        """
        if self.form != COMPUTE_COMMS:
            return None
        for r, row in enumerate(self.rows):
            last_backward: dict[int, int] = {}
            reduce_at: dict[int, int] = {}
            for i, cell in enumerate(row):
                for part in _parts(cell):
                    m = _STAGE_KIND.match(part)
                    if not m:
                        continue
                    stage, kind = int(m.group(1)), m.group(2)
                    if kind in ("B", "W"):
                        last_backward[stage] = i
                    elif kind == "REDUCE_GRAD":
                        reduce_at.setdefault(stage, i)
            for stage in self.stages_of(r):
                at = reduce_at.get(stage)
                if at is None:
                    return (
                        f"{self.source}: stage {stage} has no {stage}REDUCE_GRAD in the "
                        f"compute+comms form, so PyTorch would leave its gradients m = "
                        f"{self.microbatches} times too large; add {stage}REDUCE_GRAD,"
                        f"{stage}WAIT_REDUCE_GRAD after its last backward on rank {r}'s row"
                    )
                if at < last_backward.get(stage, -1):
                    return (
                        f"{self.source}: {stage}REDUCE_GRAD comes before stage {stage}'s last "
                        f"backward on rank {r}'s row, so PyTorch would scale only part of its "
                        "gradients; move it after that backward"
                    )
        return None

    def csv_text(self) -> str:
        """The timetable as PyTorch's CSV (rows as read, in the same form)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in self.rows:
            writer.writerow(row)
        return out.getvalue()


def load(timetable: Any, *, form: str | None = None) -> TorchTimetable:
    """Read a timetable for PyTorch's runtime.

    `timetable` is a path to a timetable file (`.csv` in any of its forms, or pipewright's
    `.json`), a `pipewright.Timetable`, or a `TorchTimetable` (returned as is). pipewright
    reads and validates it first (its errors name the file, line and column); PyTorch gets
    a compute+comms file as written, and anything else in its compute-only form, unless
    `form` asks for the other. What PyTorch cannot run (recomputation) is refused here.
    """
    if isinstance(timetable, TorchTimetable):
        return timetable
    if form not in (None, COMPUTE_ONLY, COMPUTE_COMMS):
        raise TimetableError(
            f"form {form!r} is not one of PyTorch's: use {COMPUTE_ONLY!r} or {COMPUTE_COMMS!r}"
        )
    if isinstance(timetable, pipewright.Timetable):
        name = timetable.name
        return _from_native(timetable, form, source=f"timetable {name}", name=name, text=None)
    if isinstance(timetable, (str, os.PathLike)):
        path = Path(timetable)
        native = _native(lambda: pipewright.Timetable.read(path))
        text = None
        if native.csv_form == COMPUTE_COMMS and form in (None, COMPUTE_COMMS):
            text = path.read_text(encoding="utf-8-sig")  # PyTorch gets the file as written
        name = native.name if native.name != "custom" else path.stem
        return _from_native(native, form, source=str(path), name=name, text=text)
    raise TimetableError(
        f"cannot read a timetable from {type(timetable).__name__}: give a .csv or .json "
        "path, a pipewright.Timetable or a pipewright.torch.TorchTimetable"
    )


def from_csv_text(text: str, *, name: str = "custom", form: str | None = None) -> TorchTimetable:
    """A timetable from CSV text in any of its forms (as `load` reads a file)."""
    native = _native(lambda: pipewright.Timetable.from_csv(text))
    keep = text if native.csv_form == COMPUTE_COMMS and form in (None, COMPUTE_COMMS) else None
    return _from_native(native, form, source=f"timetable {name}", name=name, text=keep)


def _native(read, source: str | None = None):
    """Call pipewright; its one-line error becomes a TimetableError naming the source."""
    try:
        return read()
    except pipewright.PipewrightError as e:
        msg = str(e)
        if source and not msg.startswith(source):
            msg = f"{source}: {msg}"
        raise TimetableError(msg) from None


def _from_native(native, form: str | None, *, source: str, name: str, text: str | None) -> TorchTimetable:
    """The rows PyTorch will load, each cell parsed by PyTorch's own parser."""
    if text is None:
        form = form or COMPUTE_ONLY
        text = _native(lambda: native.to_csv(form), source)
    else:
        form = COMPUTE_COMMS
    rows = [tuple(c.strip() for c in row if c.strip()) for row in csv.reader(io.StringIO(text))]
    rows = [row for row in rows if row]
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            _parse(cell, source, r, c)
    if len(rows) != native.devices:
        raise TimetableError(f"{source}: {len(rows)} rows for {native.devices} devices")
    return TorchTimetable(
        rows=tuple(rows),
        form=form,
        num_stages=native.stages,
        microbatches=native.microbatches,
        stage_rank=tuple(native.stage_device),
        name=name,
        source=source,
    )


def _parse(cell: str, source: str, r: int, c: int):
    from torch.distributed.pipelining.schedules import _Action

    if not cell:
        return None
    at = f"{source}:{r + 1}:{c + 1}"
    try:
        action = _Action.from_str(cell)
    except RuntimeError:
        action = None
    if action is None or str(action) != cell:
        raise TimetableError(f"{at}: `{cell}` is not an action PyTorch's runtime knows")
    if action.sub_actions is not None and (
        action.computation_type.value != "OVERLAP_F_B"
        or [a.computation_type.value for a in action.sub_actions] != ["F", "B"]
    ):
        raise TimetableError(
            f"{at}: `{cell}` is not an F&B overlap `(sFm;sBm)OVERLAP_F_B`, the only "
            "composite action pipewright writes"
        )
    return action


def _parts(cell: str) -> list[str]:
    """The plain actions of a cell: an F&B overlap `(2F5;9B3)OVERLAP_F_B` gives both."""
    if cell.startswith("("):
        return cell[1 : cell.index(")")].split(";")
    return [cell]
