"""The loop's last step, measured: run the baseline and the searched candidates in the user's own
run, a few steps each, and keep the fastest as measured, never as predicted.

A prediction can be wrong in ways a simulator cannot see (a busy host, a runtime's tail), so the
choice of timetable is confirmed by running each candidate on the user's stages, in turns, with
the same inputs. The baseline (what the user runs now) is one of the candidates, so what comes
back is never slower than it as measured: at worst it is the baseline.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch.distributed as dist

import pipewright

from ._errors import RecordError
from ._grads import restore_grads, save_grads
from ._timetable import TorchTimetable, load


@dataclass(frozen=True)
class TuneRow:
    """One candidate: its timetable, the step predicted from the costs, and as measured."""

    name: str
    timetable: TorchTimetable
    predicted_ms: float | None
    measured_ms: float
    steps_ms: list[float] = field(repr=False)


@dataclass(frozen=True)
class TuneResult:
    """Every candidate measured, the baseline first; `best` is the fastest as measured."""

    rows: list[TuneRow]
    best: TuneRow

    @property
    def baseline(self) -> TuneRow:
        return self.rows[0]

    def table(self) -> str:
        """A Markdown table: each candidate's predicted and measured step, against the
        baseline's measured step."""
        base = self.baseline.measured_ms
        lines = ["| timetable | predicted | measured (median) | against the baseline |",
                 "|---|---|---|---|"]
        for r in self.rows:
            pred = "-" if r.predicted_ms is None else f"{r.predicted_ms:.2f} ms"
            mark = " (best)" if r is self.best else ""
            lines.append(f"| {r.name}{mark} | {pred} | {r.measured_ms:.2f} ms | "
                         f"{r.measured_ms / base:.3f}x |")
        return "\n".join(lines)


def tune(
    timetables: Sequence[Any],
    build: Callable[[TorchTimetable], Any],
    *args: Any,
    steps: int = 5,
    block: int = 2,
    costs: Any = None,
    group: dist.ProcessGroup | None = None,
    **kwargs: Any,
) -> TuneResult:
    """Measure each timetable's step in this run and return the fastest.

    `timetables[0]` is the baseline, the one trained with now; the others are candidates
    (`search(...).timetables(k)`, paths, CSV-loaded timetables). `build(tt)` returns the
    PyTorch schedule for a timetable on this rank (for example
    `pwt.schedule(tt, pwt.pipeline_stages(tt, make_module), loss_fn=loss)`); `args` and
    `kwargs` go to each `step()`, as in training. After one warm-up step each, the candidates
    take turns, `steps` rounds in a new random order each (the same on every rank): a turn is
    `block` steps back to back, unfenced as training runs them, between two barriers, and
    counts as their mean; a candidate's figure is the median of its turns. `costs` (a cost
    file's path, text or `pipewright.Costs`) adds each one's predicted step. The gradients the
    stages held are put back: tuning trains nothing. Every candidate's stages are built once
    and held at once. Collective; every rank gets the same answer.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 1000:
        raise RecordError(f"steps={steps!r}: give a whole number of rounds from 1 to 1000")
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= 100:
        raise RecordError(f"block={block!r}: give a whole number of steps from 1 to 100")
    if not timetables:
        raise RecordError("timetables: give the baseline first, then the candidates")
    tts = [load(t) for t in timetables]
    model = _costs(costs)
    scheds = [build(tt) for tt in tts]
    kwargs = {k: v for k, v in kwargs.items() if k != "losses"}
    saved = [save_grads(s._stages) for s in scheds]
    times: list[list[float]] = [[] for _ in tts]
    try:
        for s in scheds:
            s.step(*args, **kwargs)
        for k in range(steps):
            order = list(range(len(tts)))
            random.Random(k).shuffle(order)  # seeded by the round: the same on every rank
            for i in order:
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(block):
                    scheds[i].step(*args, **kwargs)
                dist.barrier(group=group)
                times[i].append((time.perf_counter() - t0) * 1e3 / block)
    finally:
        for s in saved:
            restore_grads(s)
    # One decision for every rank: rank 0's clock (its steps end at the barrier, after all).
    box = [times]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0,
                               group=group)
    times = box[0]
    rows = [TuneRow(name=tt.name, timetable=tt, predicted_ms=_predict(tt, model),
                    measured_ms=statistics.median(t), steps_ms=t) for tt, t in zip(tts, times)]
    best = min(rows, key=lambda r: r.measured_ms)
    return TuneResult(rows=rows, best=best)


def _costs(costs: Any):
    if costs is None or isinstance(costs, pipewright.Costs):
        return costs
    if isinstance(costs, str) and costs.lstrip().startswith("{"):
        return pipewright.Costs.from_json(costs)
    return pipewright.Costs.read(costs)


def _predict(tt: TorchTimetable, costs) -> float | None:
    if costs is None:
        return None
    native = pipewright.Timetable.from_csv(tt.csv_text())
    return pipewright.simulate(native, costs).report.makespan
