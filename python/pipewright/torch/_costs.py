"""A cost file from recorded timelines: what `train --costs-out` writes, for `search`.

The median duration of each stage's F, B, I and W (and R) over the steps given, as
`schedule::measured_costs` computes it: a stage that ran full backwards gets `b`, one that ran
I and W gets both; F&B overlaps are left out (their halves cannot be told apart).

The native package (`pipewright`, Rust through PyO3) computes it when it offers
`measured_costs`; until then this module does the same arithmetic on the timeline dicts.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from ._errors import RecordError

_SLOTS = {"F": "f", "B": "b", "I": "i", "W": "w", "R": "r"}


def _native():
    try:
        import pipewright
    except ImportError:
        return None
    return getattr(pipewright, "measured_costs", None)


def measured_costs(timelines: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost file (a dict, JSON-ready) of the median per-stage costs of `timelines`."""
    if not timelines:
        raise RecordError("measured costs: no recorded steps given")
    native = _native()
    if native is not None:
        out = native([json.dumps(t) for t in timelines])
        return json.loads(out) if isinstance(out, str) else out
    first = timelines[0]["meta"]
    stages = int(first["stages"])
    seen: list[dict[str, list[float]]] = [{k: [] for k in _SLOTS.values()} for _ in range(stages)]
    for tl in timelines:
        for e in tl["events"]:
            slot = _SLOTS.get(e["action"]["kind"]) if isinstance(e["action"]["kind"], str) else None
            stage = e["action"]["stage"]
            if slot and 0 <= stage < stages:
                seen[stage][slot].append(e["end"] - e["start"])
    per_stage = []
    for s, kinds in enumerate(seen):
        med = {k: statistics.median(v) if v else None for k, v in kinds.items()}
        if med["f"] is None:
            raise RecordError(f"measured stage {s}: no forward (F) events given")
        cost: dict[str, float] = {"f": med["f"]}
        if med["i"] is not None and med["w"] is not None:
            cost.update(i=med["i"], w=med["w"])
        elif med["b"] is not None:
            cost["b"] = med["b"]
        else:
            raise RecordError(
                f"measured stage {s}: no standalone backward (B, or I and W) events given"
            )
        if med["r"] is not None:
            cost["r"] = med["r"]
        per_stage.append(cost)
    return {
        "stages": per_stage,
        "time_unit": first["time_unit"],
        "source": (
            f"measured: {first['schedule']} on {first['devices']} devices, {stages} stages, "
            f"{first['microbatches']} microbatches, median of {len(timelines)} steps"
        ),
    }
