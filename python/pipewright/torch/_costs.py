"""A cost file from recorded timelines: what `train --costs-out` writes, for `search`.

pipewright computes it (`Costs.from_timelines`, the median duration of each stage's F, B, I
and W over the steps given, and the median hand-off latency between ranks where the consumer
waited, as `train --costs-out` does); this module only hands it the
recorder's timelines and gives the file's text back as a dict.
"""

from __future__ import annotations

import json
from typing import Any

import pipewright

from ._errors import RecordError


def measured_costs(timelines: list, *, probe: list | None = None,
                   host: dict | None = None) -> dict[str, Any]:
    """The cost file (a dict, JSON-ready) of the median per-stage costs and hand-off latency
    of `timelines` (`pipewright.Timeline`s, or timeline dicts or JSON text); `probe`: steps of
    the same stages with the backward split, for `i` and `w`; `host`: the host time measured
    beside them (`Recorder.host_costs`)."""
    if not timelines:
        raise RecordError("measured costs: no recorded steps given")
    try:
        steps = [_timeline(t) for t in timelines]
        probed = [_timeline(t) for t in probe or []]
        costs = pipewright.Costs.from_timelines(steps, probe=probed, host=host)
        return json.loads(costs.to_json())
    except pipewright.PipewrightError as e:
        raise RecordError(str(e)) from None


def _timeline(t: Any) -> "pipewright.Timeline":
    if isinstance(t, pipewright.Timeline):
        return t
    return pipewright.Timeline.from_json(t if isinstance(t, str) else json.dumps(t))
