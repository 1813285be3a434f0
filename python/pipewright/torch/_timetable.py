"""A timetable as PyTorch's runtime reads it: one row of action strings per rank.

pipewright writes timetables in PyTorch's CSV forms (compute-only, and compute+comms with its
waits). This module only reads them back as PyTorch does, through PyTorch's own parser, and
derives what building the stages needs: the number of stages and microbatches, and which rank
holds which stage. What PyTorch's runtime cannot run is refused here, before any process
group or stage is touched, in one line that names the cell.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ._errors import TimetableError

# PyTorch's action kinds that only a lowered (compute+comms) row holds.
_COMM_KINDS = {
    "SEND_F",
    "RECV_F",
    "SEND_B",
    "RECV_B",
    "WAIT_SEND_F",
    "WAIT_SEND_B",
    "UNSHARD",
    "RESHARD",
    "REDUCE_GRAD",
    "WAIT_REDUCE_GRAD",
}
_RECOMPUTE = re.compile(r"^\s*(\d+)R(\d+)\s*$")
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

    `timetable` is a path to a `.csv` file in PyTorch's form (compute-only or compute+comms,
    told apart by their actions unless `form` says), a path to a pipewright `.json`
    timetable, a `pipewright.Timetable`, or a `TorchTimetable` (returned as is).
    """
    if isinstance(timetable, TorchTimetable):
        return timetable
    if isinstance(timetable, (str, os.PathLike)):
        path = Path(timetable)
        if path.suffix.lower() == ".json":
            return from_csv_text(_native_csv(path, form), source=str(path), name=path.stem)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise TimetableError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TimetableError(
                f"{path} is not a text file (not UTF-8 at byte {e.start})"
            ) from None
        return from_csv_text(text, source=str(path), name=path.stem, form=form)
    to_csv = getattr(timetable, "to_pytorch_csv", None)
    if callable(to_csv):
        name = str(getattr(timetable, "name", "custom"))
        text = to_csv(form or COMPUTE_ONLY)
        return from_csv_text(text, source=f"timetable {name}", name=name, form=form)
    raise TimetableError(
        f"cannot read a timetable from {type(timetable).__name__}: give a .csv or .json "
        "path, a pipewright.Timetable or a pipewright.torch.TorchTimetable"
    )


def _native_csv(path: Path, form: str | None) -> str:
    """A pipewright JSON timetable in PyTorch's CSV form, written by the native package."""
    try:
        import pipewright  # the native package (py-core)

        read = pipewright.Timetable.load
    except (ImportError, AttributeError):
        raise TimetableError(
            f"{path}: reading a pipewright JSON timetable needs the native pipewright "
            "package; give the timetable as PyTorch's .csv (`pipewright schedule -o x.csv`)"
        ) from None
    return read(str(path)).to_pytorch_csv(form or COMPUTE_ONLY)


def from_csv_text(
    text: str, *, source: str = "timetable", name: str = "custom", form: str | None = None
) -> TorchTimetable:
    """Parse PyTorch's CSV text (one row per rank) and check what the runtime needs."""
    if form not in (None, COMPUTE_ONLY, COMPUTE_COMMS):
        raise TimetableError(
            f"form {form!r} is not one of PyTorch's: use {COMPUTE_ONLY!r} or {COMPUTE_COMMS!r}"
        )
    rows = [tuple(cell.strip() for cell in row) for row in csv.reader(io.StringIO(text))]
    while rows and not any(rows[-1]):
        rows.pop()  # a trailing blank line is no rank
    if not rows:
        raise TimetableError(f"{source}: no rows; a timetable has one row per rank")
    for r, row in enumerate(rows):
        if not any(row):
            raise TimetableError(
                f"{source}:{r + 1}: rank {r}'s row is empty; every rank needs its actions"
            )
    parsed = [[_parse(cell, source, r, c) for c, cell in enumerate(row)] for r, row in enumerate(rows)]
    has_comms = any(a.computation_type.value in _COMM_KINDS for row in parsed for a in row if a)
    found = COMPUTE_COMMS if has_comms else COMPUTE_ONLY
    if form == COMPUTE_ONLY and has_comms:
        raise TimetableError(
            f"{source}: holds communication actions, so it is PyTorch's compute+comms form, "
            f"not compute-only; load it with form={COMPUTE_COMMS!r}"
        )
    stage_rank, stages, microbatches = _shape(parsed, source)
    return TorchTimetable(
        rows=tuple(tuple(c for c in row if c) for row in rows),
        form=form or found,
        num_stages=stages,
        microbatches=microbatches,
        stage_rank=tuple(stage_rank),
        name=name,
        source=source,
    )


def _parse(cell: str, source: str, r: int, c: int):
    from torch.distributed.pipelining.schedules import _Action

    if not cell:
        return None
    at = f"{source}:{r + 1}:{c + 1}"
    m = _RECOMPUTE.match(cell)
    if m:
        raise TimetableError(
            f"{at}: `{cell}` recomputes stage {m.group(1)} (an R action), which PyTorch's "
            f"runtime cannot run; write the timetable without --recompute and use activation "
            f"checkpointing (torch.utils.checkpoint) inside stage {m.group(1)}'s module instead"
        )
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


def _shape(parsed: Sequence[Sequence[Any]], source: str) -> tuple[list[int], int, int]:
    """The stage-to-rank map, the stage count and the microbatch count of parsed rows."""
    holder: dict[int, int] = {}
    microbatches = 0
    for r, row in enumerate(parsed):
        for action in row:
            if action is None:
                continue
            for part in action.sub_actions or (action,):
                kind = part.computation_type.value
                if kind in ("UNSHARD", "RESHARD", "REDUCE_GRAD", "WAIT_REDUCE_GRAD"):
                    continue
                s = part.stage_index
                if holder.setdefault(s, r) != r:
                    raise TimetableError(
                        f"{source}: stage {s} has actions on ranks {holder[s]} and {r}; "
                        "a stage lives on one rank"
                    )
                if kind == "F" and part.microbatch_index is not None:
                    microbatches = max(microbatches, part.microbatch_index + 1)
    stages = max(holder) + 1 if holder else 0
    missing = [s for s in range(stages) if s not in holder]
    if missing:
        raise TimetableError(f"{source}: stage {missing[0]} has no actions on any rank")
    return [holder[s] for s in range(stages)], stages, microbatches


def _parts(cell: str) -> list[str]:
    """The plain actions of a cell: an F&B overlap `(2F5;9B3)OVERLAP_F_B` gives both."""
    if cell.startswith("("):
        return cell[1 : cell.index(")")].split(";")
    return [cell]
