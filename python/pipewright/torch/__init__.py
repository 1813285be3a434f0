"""PyTorch's pipelining runtime as an executor of pipewright timetables.

    tt = pipewright.torch.load("best.csv")                 # any pipewright timetable
    stages = pipewright.torch.pipeline_stages(tt, modules)  # this rank's stages, placed
    sched = pipewright.torch.schedule(tt, stages, loss_fn=loss)
    rec = pipewright.torch.Recorder(sched)
    rec.step(x, target=y)                                   # a real, timed step
    rec.probe_split(x, target=y)                            # I and W on the same stages
    rec.save_timeline("step.json"); rec.save_costs("costs.json")
    best = pipewright.torch.tune([tt, *found.timetables()], build, x, target=y).best
    cfg = pipewright.torch.titan_config("best.csv", layer_fqns, local_batch_size=8)  # torchtitan

See docs/python-torch.md.
"""

try:
    import torch as _torch  # noqa: F401  (PyTorch is this subpackage's one requirement)
except ImportError:
    raise ImportError(
        "pipewright.torch needs PyTorch: pip install torch (or pip install \"./python[torch]\")"
    ) from None

from ._errors import (BatchError, GradError, RecordError, StageError, TimetableError, TitanError,
                      TorchError)
from ._costs import measured_costs
from ._grads import check_grads
from ._record import Recorder
from ._run import pipeline_stages, schedule, stage_ranks
from ._synthetic import Sleep
from ._titan import TitanConfig, check_titan_config, split_layers, titan_config
from ._tune import TuneResult, TuneRow, tune
from ._timetable import COMPUTE_COMMS, COMPUTE_ONLY, TorchTimetable, from_csv_text, load

__all__ = [
    "BatchError",
    "COMPUTE_COMMS",
    "COMPUTE_ONLY",
    "GradError",
    "RecordError",
    "Recorder",
    "Sleep",
    "StageError",
    "TimetableError",
    "TitanConfig",
    "TitanError",
    "TorchError",
    "TorchTimetable",
    "TuneResult",
    "TuneRow",
    "check_grads",
    "check_titan_config",
    "from_csv_text",
    "load",
    "measured_costs",
    "pipeline_stages",
    "schedule",
    "split_layers",
    "stage_ranks",
    "titan_config",
    "tune",
]
