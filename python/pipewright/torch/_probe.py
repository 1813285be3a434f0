"""The backward probe: the recorded timetable with each backward run the other way, in place.

A timetable recorded with fused backwards (1F1B, interleaved, GPipe) says nothing of what a
split one costs, and one recorded with split backwards (zb-h1, zbv) nothing of a fused one; in
PyTorch's runtime I + W is not B: the input gradient and the weight gradient are two passes
through autograd. Splitting each `B` cell into `I` then `W` at the same place (or fusing each
`I` into a `B` there and dropping its `W`) keeps every dependency and every hand-off of the
recorded timetable, so a few steps of it on the same stages measure the other backward and
nothing else changes.
"""

from __future__ import annotations

import re

from ._timetable import COMPUTE_ONLY, TorchTimetable, from_csv_text

_FUSED = re.compile(r"^(\d+)B(\d+)$")
_INPUT = re.compile(r"^(\d+)I(\d+)$")
_WEIGHT = re.compile(r"^\d+W\d+$")


def backward_probe(tt: TorchTimetable) -> TorchTimetable | None:
    """`tt` with each `B` split into `I` then `W` in place, or, when it has no `B`, each `I`
    fused into a `B` in place and its `W` dropped (compute-only form); None when it has
    neither (only overlapped F&B cells)."""
    if tt.form != COMPUTE_ONLY:  # pipewright's writer gives the compute order
        tt = from_csv_text(tt.csv_text(), name=tt.name, form=COMPUTE_ONLY)
    rows = tt.rows
    if any(_FUSED.match(c) for row in rows for c in row):
        out, how = [_split(row) for row in rows], "split"
    elif any(_INPUT.match(c) for row in rows for c in row):
        out, how = [_fuse(row) for row in rows], "fused"
    else:
        return None
    text = "\n".join(",".join(row) for row in out) + "\n"
    return from_csv_text(text, name=f"{tt.name} {how} probe", form=COMPUTE_ONLY)


def _split(row) -> list[str]:
    cells = []
    for cell in row:
        m = _FUSED.match(cell)
        cells += [f"{m[1]}I{m[2]}", f"{m[1]}W{m[2]}"] if m else [cell]
    return cells


def _fuse(row) -> list[str]:
    cells = []
    for cell in row:
        m = _INPUT.match(cell)
        if m:
            cells.append(f"{m[1]}B{m[2]}")
        elif not _WEIGHT.match(cell):
            cells.append(cell)
    return cells

