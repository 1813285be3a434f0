"""Run a pipewright timetable in PyTorch's `_PipelineScheduleRuntime` from the user's stages.

The timetable decides which rank holds which stage (loop placement: stage `s` on rank
`s % p`; V placement: stages `r` and `2p - 1 - r` on rank `r`); `pipeline_stages` builds this
rank's `PipelineStage`s from the user's modules on that map, and `schedule` checks that the
stages given match it before PyTorch loads the timetable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from ._errors import BatchError, StageError, TimetableError
from ._timetable import TorchTimetable, load

__all__ = ["pipeline_stages", "schedule", "stage_ranks"]


def stage_ranks(timetable: Any) -> list[int]:
    """`stage_ranks(t)[s]`: the pipeline rank that holds stage `s` in the timetable."""
    return list(load(timetable).stage_rank)


def _group_rank(group: dist.ProcessGroup | None, tt: TorchTimetable) -> int:
    if not dist.is_initialized():
        raise StageError(
            "torch.distributed is not initialized: call dist.init_process_group first "
            "(one process per pipeline rank)"
        )
    size = dist.get_world_size(group)
    if size != tt.num_ranks:
        raise StageError(
            f"{tt.source} has {tt.num_ranks} ranks (one row each), but the pipeline group "
            f"has {size} processes; give a group of {tt.num_ranks}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise StageError("this process is not in the pipeline group it was given")
    return rank


def _module_for(modules: Any, stage: int, stages: int) -> torch.nn.Module:
    if isinstance(modules, Mapping):
        if stage not in modules:
            raise StageError(
                f"no module for stage {stage}: the modules given are for stages "
                f"{sorted(modules)}"
            )
        module = modules[stage]
    elif isinstance(modules, Sequence):
        if len(modules) != stages:
            raise StageError(
                f"{len(modules)} modules given for a timetable of {stages} stages: give one "
                "per stage, a mapping from stage to module, or a function of the stage"
            )
        module = modules[stage]
    elif callable(modules):
        module = modules(stage)
    else:
        raise StageError(
            f"modules must be a function of the stage, a mapping or a sequence, not "
            f"{type(modules).__name__}"
        )
    if not isinstance(module, torch.nn.Module):
        raise StageError(f"the module for stage {stage} is a {type(module).__name__}, not an nn.Module")
    return module


def pipeline_stages(
    timetable: Any,
    modules: Callable[[int], torch.nn.Module] | Mapping[int, torch.nn.Module] | Sequence[torch.nn.Module],
    *,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> list[PipelineStage]:
    """This rank's `PipelineStage`s, in stage order, on the timetable's stage-to-rank map.

    `modules` gives a stage's module: a function of the stage index (called only for the
    stages this rank holds), a mapping from stage index to module, or a sequence with one
    module per stage.
    """
    tt = load(timetable)
    rank = _group_rank(group, tt)
    device = torch.device(device)
    return [
        PipelineStage(_module_for(modules, s, tt.num_stages), s, tt.num_stages, device, group=group)
        for s in tt.stages_of(rank)
    ]


def schedule(
    timetable: Any,
    stages: PipelineStage | Sequence[PipelineStage],
    *,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    scale_grads: bool = True,
    **runtime_kwargs: Any,
) -> _PipelineScheduleRuntime:
    """PyTorch's `_PipelineScheduleRuntime` running `timetable` with this rank's `stages`.

    The stages must be exactly those the timetable places on this rank (`pipeline_stages`
    builds them). `loss_fn` and `scale_grads` are PyTorch's; other keyword arguments go to
    the runtime unchanged. Call `.step(...)` on the result as with any PyTorch schedule.
    """
    tt = load(timetable)
    unscaled = tt.unscaled_stage() if scale_grads else None
    if unscaled:
        raise TimetableError(unscaled)
    stages = [stages] if isinstance(stages, PipelineStage) else list(stages)
    if not stages:
        raise StageError("no stages given: this rank holds stages of the timetable")
    group = stages[0].group
    rank = _group_rank(group, tt)
    given = sorted(st.stage_index for st in stages)
    want = tt.stages_of(rank)
    if given != want:
        raise StageError(
            f"rank {rank} holds stages {want} in {tt.source} (placement {tt.placement}), "
            f"but was given stages {given}; build them with pipewright.torch.pipeline_stages"
        )
    for st in stages:
        if st.num_stages != tt.num_stages:
            raise StageError(
                f"stage {st.stage_index} was built for {st.num_stages} stages, but "
                f"{tt.source} has {tt.num_stages}"
            )
    stages = sorted(stages, key=lambda st: st.stage_index)
    runtime = _PipelineScheduleRuntime(
        stages,
        n_microbatches=tt.microbatches,
        loss_fn=loss_fn,
        scale_grads=scale_grads,
        **runtime_kwargs,
    )
    _load_into(runtime, tt)
    runtime.pipewright_timetable = tt
    _check_steps(runtime, tt, group)
    return runtime


# `step`'s own keywords: no batch to split among them.
_STEP_KEYWORDS = {"losses", "return_outputs", "loss_kwargs", "arg_mbs", "kwarg_mbs", "target_mbs",
                  "finalize_gradients"}


def _check_steps(runtime: _PipelineScheduleRuntime, tt: TorchTimetable, group) -> None:
    """Refuse, before PyTorch runs it, a step that would fail inside PyTorch with no word of
    why, or leave the other ranks waiting until the process group's timeout:
    - a batch that does not split into the timetable's microbatches of equal size (only
      where PyTorch splits on dim 0, its default; a chunk spec of the user's is theirs);
    - no `target=` on the rank holding the last stage while the loss needs one.
    The first step's verdicts are gathered from every rank, so every rank refuses it at
    once, naming the rank at fault; later steps are checked where they run."""
    split = runtime._args_chunk_spec is None and runtime._kwargs_chunk_spec is None
    last = any(st.is_last for st in runtime._stages)
    step, m, rank = runtime.step, tt.microbatches, dist.get_rank(group)
    first = [True]

    def fault(args: tuple, kwargs: dict) -> str | None:
        if last and runtime._loss_fn is not None and kwargs.get("target") is None:
            return (f"rank {rank} holds the last stage and the schedule has a loss_fn, but "
                    "step() got no target=: give the targets on that rank, "
                    "step(..., target=y)")
        if not split:
            return None
        named = [(f"input {i}", a) for i, a in enumerate(args)]
        named += [(f"{k}=", v) for k, v in kwargs.items() if k not in _STEP_KEYWORDS]
        for what, x in named:
            if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.size(0) % m:
                return (f"rank {rank}: {what} has a batch of {x.size(0)} (dim 0), which does "
                        f"not split into the {m} microbatches of {tt.source}: give a batch "
                        f"that {m} divides, e.g. {max(m, x.size(0) // m * m)}")
        return None

    def step_checked(*args: Any, **kwargs: Any) -> Any:
        mine = fault(args, kwargs)
        if first[0]:
            first[0] = False
            every: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(every, mine, group=group)
            mine = next((f for f in every if f), None)
        if mine:
            raise BatchError(mine)
        return step(*args, **kwargs)

    runtime.step = step_checked


def _load_into(runtime: _PipelineScheduleRuntime, tt: TorchTimetable) -> None:
    """Load through PyTorch's own `_load_csv`, as torchtitan does, in the timetable's form."""
    fd, path = tempfile.mkstemp(suffix=".csv", prefix="pipewright-")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(tt.csv_text())
        runtime._load_csv(path, format=tt.form)
    finally:
        os.unlink(path)
