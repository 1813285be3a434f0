"""The errors `pipewright.torch` raises: each a one-line message naming what is wrong.

They are `pipewright.PipewrightError`s (so `ValueError`s): one `except` catches the engine's
errors and the runner's alike.
"""

from pipewright import PipewrightError


class TorchError(PipewrightError):
    """A timetable, a stage or a recording that PyTorch's runtime cannot use as given."""


class TimetableError(TorchError):
    """A timetable PyTorch's runtime cannot run: the message names the file and the cell."""


class StageError(TorchError):
    """Stages that do not match the timetable on this rank."""


class BatchError(TorchError):
    """A step that cannot run: a batch that does not split into the timetable's
    microbatches, or no `target=` where the loss needs one."""


class RecordError(TorchError):
    """A recording that cannot become a timeline or a cost file."""


class TitanError(TorchError):
    """torchtitan settings that cannot run the timetable: the message names the setting."""


class GradError(TorchError):
    """A parameter that ended a step without a gradient, or with one unlike the reference."""
