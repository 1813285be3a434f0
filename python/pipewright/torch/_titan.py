"""torchtitan's pipeline settings from a pipewright timetable, checked before torchtitan runs.

torchtitan 0.3 (`torchtitan.distributed.pipeline_parallel`) runs a timetable given by
`pipeline_parallel_schedule_csv`, but takes the stage-to-rank map from the *name* in
`pipeline_parallel_schedule` (V placement for ZBVZeroBubble and DualPipeV, loop placement for
every other name) and the stage count from `module_fqns_per_model_part` (or from the name when
that is not given). A mismatch fails only at the first step (`PipeliningMetadataError`) or
with a bare `KeyError`. `titan_config` derives every setting from the timetable, and
`check_titan_config` refuses a hand-written config that does not match, naming the setting.
Nothing here imports torchtitan.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipewright

from ._errors import TitanError
from ._outputs import write_output
from ._timetable import COMPUTE_ONLY, TorchTimetable, load

__all__ = ["TitanConfig", "check_titan_config", "split_layers", "titan_config"]

# torchtitan places stages in a V only for these schedule classes (its
# `_get_pp_rank_to_stage_indices_mapping`); every other name means loop placement.
_V_CLASSES = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


@dataclass(frozen=True)
class TitanConfig:
    """What torchtitan's `ParallelismConfig` needs to run a timetable.

    `fields()` gives `ParallelismConfig` keyword arguments; `stage_indices[r]` are the stages
    rank r holds (what torchtitan's `_pipeline_module_split` builds there).
    """

    schedule: str
    schedule_csv: str
    degree: int
    num_stages: int
    microbatches: int
    microbatch_size: int
    placement: str
    stage_indices: tuple[tuple[int, ...], ...]
    module_fqns_per_model_part: tuple[tuple[str, ...], ...] | None

    def fields(self) -> dict[str, Any]:
        """`ParallelismConfig(**cfg.fields())`, or `dataclasses.replace(parallelism, ...)`."""
        out: dict[str, Any] = {
            "pipeline_parallel_degree": self.degree,
            "pipeline_parallel_schedule": self.schedule,
            "pipeline_parallel_schedule_csv": self.schedule_csv,
            "pipeline_parallel_microbatch_size": self.microbatch_size,
        }
        if self.module_fqns_per_model_part is not None:
            out["module_fqns_per_model_part"] = [list(p) for p in self.module_fqns_per_model_part]
        return out


def titan_config(
    timetable: Any,
    layers: Sequence[str] | None = None,
    *,
    local_batch_size: int,
    schedule: str | None = None,
    cuts: Sequence[int] | None = None,
    csv_path: str | os.PathLike | None = None,
) -> TitanConfig:
    """torchtitan's pipeline settings for `timetable` (a path, a `pipewright.Timetable` or a
    `TorchTimetable`).

    `layers`: the model's module FQNs in forward order (`["tok_embeddings", "layers.0", ...,
    "norm", "lm_head"]`), cut into one contiguous part per stage: evenly (parts differ by at
    most one module, the first ones larger), or at `cuts` (for each stage after the first,
    the index in `layers` where it begins). Without `layers` torchtitan splits the model
    itself, into p stages for a single-stage name and 2p for any other; a timetable with
    another stage count is refused. `schedule`: the name torchtitan gets; by default one whose
    placement matches (1F1B, Interleaved1F1B, ZBVZeroBubble, or DualPipeV for a DualPipeV
    timetable). `csv_path`: where to write the compute-only CSV torchtitan reads (atomically);
    not needed when `timetable` is such a `.csv` file already.
    """
    tt = load(timetable, form=COMPUTE_ONLY)
    if tt.placement == "custom":
        raise TitanError(
            f"{tt.source}: its stage-to-rank map {list(tt.stage_rank)} is neither loop nor V "
            "placement, the only two torchtitan builds"
        )
    name = _default_name(tt) if schedule is None else schedule
    _check_name(name, tt, "schedule")
    fqns = None
    if layers is not None:
        fqns = split_layers(layers, tt.num_stages, cuts)
    elif cuts is not None:
        raise TitanError("cuts= cuts layers=: give the model's module FQNs as layers too")
    else:
        _check_default_count(name, tt, "layers")
    return TitanConfig(
        schedule=name,
        schedule_csv=_csv_for(timetable, tt, csv_path),
        degree=tt.num_ranks,
        num_stages=tt.num_stages,
        microbatches=tt.microbatches,
        microbatch_size=_microbatch_size(local_batch_size, tt),
        placement=tt.placement,
        stage_indices=tuple(tuple(tt.stages_of(r)) for r in range(tt.num_ranks)),
        module_fqns_per_model_part=fqns,
    )


def check_titan_config(timetable: Any, parallelism: Any, *, local_batch_size: int) -> None:
    """Refuse a torchtitan `ParallelismConfig` that cannot run `timetable`, naming the field:
    the degree, the schedule name's placement, the parts of `module_fqns_per_model_part`, and
    the microbatch count."""
    tt = load(timetable, form=COMPUTE_ONLY)
    degree = parallelism.pipeline_parallel_degree
    if degree != tt.num_ranks:
        raise TitanError(
            f"pipeline_parallel_degree is {degree}, but {tt.source} has {tt.num_ranks} ranks "
            "(one row each)"
        )
    name = parallelism.pipeline_parallel_schedule
    _check_name(name, tt, "pipeline_parallel_schedule")
    _check_csv(getattr(parallelism, "pipeline_parallel_schedule_csv", None), name, tt)
    parts = parallelism.module_fqns_per_model_part
    if parts is None:
        _check_default_count(name, tt, "module_fqns_per_model_part")
    elif len(parts) != tt.num_stages:
        raise TitanError(
            f"module_fqns_per_model_part has {len(parts)} parts, but {tt.source} has "
            f"{tt.num_stages} stages: give one part per stage"
        )
    mb = parallelism.pipeline_parallel_microbatch_size
    want = _microbatch_size(local_batch_size, tt)
    if mb != want:
        raise TitanError(
            f"pipeline_parallel_microbatch_size is {mb}, so torchtitan would cut the local "
            f"batch of {local_batch_size} into {local_batch_size // max(mb, 1)} microbatches, "
            f"but {tt.source} has {tt.microbatches}: use {want}"
        )


def _check_csv(csv: Any, name: str, tt: TorchTimetable) -> None:
    """torchtitan runs the file `pipeline_parallel_schedule_csv` names, or, when none is set,
    its own schedule of that name: the file must be there and hold `tt`'s actions."""
    if not csv:
        raise TitanError(
            f"pipeline_parallel_schedule_csv is not set, so torchtitan would run its own {name} "
            f"schedule, not {tt.source}: set it to the timetable's compute-only CSV"
        )
    try:
        given = load(csv)
    except (pipewright.PipewrightError, OSError) as e:
        raise TitanError(f"pipeline_parallel_schedule_csv: {e}") from e
    if given.form != COMPUTE_ONLY:
        raise TitanError(
            f"pipeline_parallel_schedule_csv {csv} holds the {given.form} form; torchtitan reads "
            "the compute-only one: write it with titan_config(..., csv_path=)"
        )
    if given.rows != tt.rows:
        raise TitanError(
            f"pipeline_parallel_schedule_csv {csv} does not hold the actions of {tt.source}: "
            "write the timetable there (titan_config does) or point at its file"
        )


def split_layers(layers: Sequence[str], stages: int, cuts: Sequence[int] | None = None
                 ) -> tuple[tuple[str, ...], ...]:
    """`layers` in `stages` contiguous non-empty parts: evenly, or beginning at `cuts`."""
    if isinstance(layers, str):
        raise TitanError("layers must be a list of module FQNs, not one string")
    layers = list(layers)
    if not all(isinstance(x, str) and x for x in layers):
        raise TitanError("layers must be module FQNs (non-empty strings), in forward order")
    dup = next((x for x in layers if layers.count(x) > 1), None)
    if dup is not None:
        raise TitanError(f"layers names {dup!r} twice: each module belongs to one stage")
    n = len(layers)
    if n < stages:
        raise TitanError(
            f"layers has {n} modules for {stages} stages: each stage needs at least one"
        )
    if cuts is None:
        size, extra = divmod(n, stages)
        starts = [s * size + min(s, extra) for s in range(stages)]
    else:
        starts = [0, *cuts]
        if len(starts) != stages:
            raise TitanError(
                f"cuts has {len(starts) - 1} indices for {stages} stages: give {stages - 1}, "
                "for each stage after the first the index in layers where it begins"
            )
        if any(not isinstance(b, int) or not 0 < b < n for b in starts[1:]) or any(
            a >= b for a, b in zip(starts, starts[1:])
        ):
            raise TitanError(
                f"cuts {list(cuts)} must increase strictly within 1..{n - 1} (indices into "
                "layers), so that every stage gets at least one module"
            )
    ends = [*starts[1:], n]
    return tuple(tuple(layers[a:b]) for a, b in zip(starts, ends))


def _default_name(tt: TorchTimetable) -> str:
    if tt.placement == "v":
        return "DualPipeV" if "dualpipe" in tt.name.lower() else "ZBVZeroBubble"
    return "1F1B" if tt.num_stages == tt.num_ranks else "Interleaved1F1B"


def _schedule_class(name: Any, what: str):
    from torch.distributed.pipelining.schedules import get_schedule_class

    try:
        return get_schedule_class(name)
    except (ValueError, AttributeError, TypeError) as e:
        raise TitanError(f"{what} {name!r} is not a schedule PyTorch knows: {e}") from None


def _check_name(name: Any, tt: TorchTimetable, what: str) -> None:
    """torchtitan places stages by the name's class: it must be the timetable's placement."""
    named = "v" if _schedule_class(name, what).__name__ in _V_CLASSES else "loop"
    if named != tt.placement:
        fix = "ZBVZeroBubble or DualPipeV" if tt.placement == "v" else "1F1B or Interleaved1F1B"
        raise TitanError(
            f"{what} {name!r} makes torchtitan place stages in {named} placement, but "
            f"{tt.source} is in {tt.placement} placement (stage to rank "
            f"{list(tt.stage_rank)}): use {fix}"
        )


def _check_default_count(name: str, tt: TorchTimetable, what: str) -> None:
    """Without module_fqns_per_model_part torchtitan makes p stages for a single-stage name
    and 2p for any other."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    single = issubclass(_schedule_class(name, "schedule"), PipelineScheduleSingle)
    count = tt.num_ranks * (1 if single else 2)
    if count != tt.num_stages:
        raise TitanError(
            f"{tt.source} has {tt.num_stages} stages, but without module_fqns_per_model_part "
            f"torchtitan makes {count} for schedule {name!r}: give {what} (the model's module "
            "FQNs, one part per stage)"
        )


def _microbatch_size(local_batch_size: Any, tt: TorchTimetable) -> int:
    if (not isinstance(local_batch_size, int) or local_batch_size < 1
            or local_batch_size % tt.microbatches):
        raise TitanError(
            f"local_batch_size {local_batch_size!r} does not split into the "
            f"{tt.microbatches} microbatches of {tt.source}: give a multiple of "
            f"{tt.microbatches}"
        )
    return local_batch_size // tt.microbatches


def _csv_for(timetable: Any, tt: TorchTimetable, csv_path: Any) -> str:
    """The compute-only CSV torchtitan loads (its `_load_csv` reads only that form)."""
    if csv_path is None:
        if isinstance(timetable, (str, os.PathLike)) and Path(timetable).suffix == ".csv":
            if load(timetable).form == COMPUTE_ONLY:
                return str(Path(timetable))
        raise TitanError(
            f"{tt.source} is not a compute-only .csv file, the one form torchtitan reads: "
            "give csv_path= to write one"
        )
    # Written as every output of pipewright.torch is: whole or not at all, never over the
    # timetable file it was read from.
    inputs = [("the timetable", os.fspath(timetable))] if isinstance(
        timetable, (str, os.PathLike)) else []
    write_output(csv_path, tt.csv_text(), inputs, "csv_path")
    return str(Path(csv_path))
