"""PyTorch's pipelining runtime as an executor of pipewright timetables.

    tt = pipewright.torch.load("best.csv")                 # any pipewright timetable
    stages = pipewright.torch.pipeline_stages(tt, modules)  # this rank's stages, placed
    sched = pipewright.torch.schedule(tt, stages, loss_fn=loss)
    rec = pipewright.torch.Recorder(sched)
    rec.step(x, target=y)                                   # a real, timed step
    rec.probe_split(x, target=y)                            # I and W on the same stages
    rec.save_timeline("step.json"); rec.save_costs("costs.json")
    best = pipewright.torch.tune([tt, *found.timetables()], build, x, target=y).best

See docs/python-torch.md.
"""

try:
    import torch as _torch  # noqa: F401  (PyTorch is this subpackage's one requirement)
except ImportError:
    raise ImportError(
        "pipewright.torch needs PyTorch: pip install torch (or pip install \"./python[torch]\")"
    ) from None

from ._errors import BatchError, RecordError, StageError, TimetableError, TorchError
from ._costs import measured_costs
from ._record import Recorder
from ._run import pipeline_stages, schedule, stage_ranks
from ._synthetic import Sleep
from ._tune import TuneResult, TuneRow, tune
from ._timetable import COMPUTE_COMMS, COMPUTE_ONLY, TorchTimetable, from_csv_text, load

__all__ = [
    "BatchError",
    "COMPUTE_COMMS",
    "COMPUTE_ONLY",
    "RecordError",
    "Recorder",
    "Sleep",
    "StageError",
    "TimetableError",
    "TorchError",
    "TorchTimetable",
    "TuneResult",
    "TuneRow",
    "from_csv_text",
    "load",
    "measured_costs",
    "pipeline_stages",
    "schedule",
    "stage_ranks",
    "tune",
]
