"""The split-backward probe: the recorded timetable with each fused backward split in place.

A timetable recorded with fused backwards (1F1B, interleaved, GPipe) says nothing of what a
split one costs, and in PyTorch's runtime I + W is not B: the input gradient and the weight
gradient are two passes through autograd. Splitting each `B` cell into `I` then `W` at the same
place keeps every dependency and every hand-off of the recorded timetable, so a few steps of it
on the same stages measure I and W and nothing else changes.
"""

from __future__ import annotations

import re

from ._timetable import COMPUTE_ONLY, TorchTimetable, from_csv_text

_FUSED = re.compile(r"^(\d+)B(\d+)$")


def split_probe(tt: TorchTimetable) -> TorchTimetable | None:
    """`tt` with each `B` cell split into `I` then `W` in place (compute-only form), or None
    when it has no fused backward to split."""
    compute = tt if tt.form == COMPUTE_ONLY else None
    rows = compute.rows if compute else _compute_rows(tt)
    out, split = [], False
    for row in rows:
        cells = []
        for cell in row:
            m = _FUSED.match(cell)
            if m:
                cells += [f"{m[1]}I{m[2]}", f"{m[1]}W{m[2]}"]
                split = True
            else:
                cells.append(cell)
        out.append(",".join(cells))
    if not split:
        return None
    return from_csv_text("\n".join(out) + "\n", name=f"{tt.name} split probe", form=COMPUTE_ONLY)


def _compute_rows(tt: TorchTimetable) -> list[tuple[str, ...]]:
    """The compute cells of a compute+comms timetable, in order."""
    compute = re.compile(r"^\d+[FBIW]\d+$|^\(.*\)OVERLAP_F_B$")
    return [tuple(c for c in row if compute.match(c)) for row in tt.rows]
