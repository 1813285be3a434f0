"""Time every action of real PyTorch steps and write them as pipewright's timeline.

PyTorch's runtime walks this rank's lowered row (`pipeline_order_with_comms[rank]`) one
action at a time. The recorder swaps that row for a list that stamps the clock each time the
runtime takes the next action, and wraps each stage's `forward_one_chunk`,
`backward_one_chunk` and `backward_weight_one_chunk` to stamp when the compute itself starts
and ends. Nothing of PyTorch's is changed otherwise: the same actions run in the same order.

From the stamps, per action:
- F, B, I, W, OVERLAP_F_B: from the start of its compute (after any wait for its input) to
  the end of the action (the loss, on the last stage, is part of F);
- RECV_F / RECV_B: the wait for the data, from the start of the action that needs it to the
  start of its compute (PyTorch posts the receive earlier and waits inside the compute action);
- SEND_F / SEND_B: posting the send;
- PyTorch's own actions (WAIT_SEND_*, REDUCE_GRAD, UNSHARD, ...): not in pipewright's IR; their
  time is kept per step as `runtime_ms`, to tell what a step is made of.

The host time the simulator charges on the compute thread is sampled too (`host` in the cost
file, see docs/python-torch.md): posting each send and each receive, each of PyTorch's own
actions, and each compute action's time from being taken to its compute's start where no
receive was waited for (the bookkeeping before a compute). `probe_split` measures the split
backward (I then W) on the same stages when the recorded timetable has only fused ones.

The clock is a CUDA event on the current stream when the stages are on a GPU, and the
monotonic clock otherwise. Ranks are aligned by a barrier when the recorder starts (exactly,
through the shared monotonic clock, when all ranks time on the CPU of one host); with
`fence=True` each recorded step starts after a barrier, as one step on its own.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import pipewright

from ._costs import measured_costs
from ._grads import restore_grads, save_grads
from ._errors import RecordError
from ._outputs import inputs_of, write_output

_COMPUTE = ("F", "B", "I", "W")


class _CpuClock:
    def stamp(self) -> int:
        return time.perf_counter_ns()

    def reference(self) -> int:
        return time.perf_counter_ns()

    def to_ms(self, ref: int, stamps: list) -> list[float]:
        return [(s - ref) / 1e6 for s in stamps]


class _CudaClock:
    def __init__(self, device: torch.device):
        self.device = device

    def stamp(self):
        # On the stream the stages compute on: the event completes when the GPU gets there.
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def reference(self):
        torch.cuda.synchronize(self.device)
        return self.stamp()

    def to_ms(self, ref, stamps: list) -> list[float]:
        torch.cuda.synchronize(self.device)
        return [ref.elapsed_time(s) for s in stamps]


@dataclass
class _Take:
    """The stamps of one step on this rank."""

    row: list
    ref: Any
    bounds: list = field(default_factory=list)  # bounds[i]: action i starts; bounds[i+1]: it ends
    compute: dict = field(default_factory=dict)  # action index -> [start, end, start, end, ...]
    # action index -> [start, end, ...] of the model's own work in it: the stage module's
    # forward (in an F) and autograd's backward (in a B, I or W)
    inner: dict = field(default_factory=dict)
    current: int | None = None


class _Probe:
    """What the row and the wrapped stage methods stamp into: the step being recorded, if any.

    One per schedule, shared by all its recorders, so that any of them can record a step."""

    def __init__(self):
        self.take: _Take | None = None
        self.stamp = None
        self.in_autograd = False


class _TimedRow(list):
    """PyTorch's row, unchanged, that stamps the clock as the runtime takes each action."""

    def __init__(self, row, probe: _Probe):
        super().__init__(row)
        self._probe = probe

    def __iter__(self):
        take, stamp = self._probe.take, self._probe.stamp
        if take is None or take.bounds:
            yield from list.__iter__(self)
            return
        for i, action in enumerate(list.__iter__(self)):
            take.current = i
            take.bounds.append(stamp())
            yield action
        take.bounds.append(stamp())
        take.current = None


def _timed(method, probe: _Probe):
    def wrapper(*args, **kwargs):
        take = probe.take
        if take is None or take.current is None:
            return method(*args, **kwargs)
        spans = take.compute.setdefault(take.current, [])
        spans.append(probe.stamp())
        try:
            return method(*args, **kwargs)
        finally:
            spans.append(probe.stamp())

    wrapper.__wrapped__ = method
    return wrapper


def _probe_of(schedule) -> _Probe:
    """The schedule's probe, its stage methods wrapped once, and its stage modules hooked to
    stamp their own forward."""
    probe = getattr(schedule, "_pipewright_probe", None)
    if probe is None:
        probe = _Probe()
        for st in schedule._stages:
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                setattr(st, name, _timed(getattr(st, name), probe))
            st.submod.register_forward_pre_hook(lambda *_: _inner_stamp(probe, "F"))
            st.submod.register_forward_hook(lambda *_: _inner_stamp(probe, "F"))
        schedule._pipewright_probe = probe
    return probe


def _inner_stamp(probe: _Probe, kind: str) -> None:
    """A start or end of the model's own work inside the action being taken, if it is of
    `kind` (a module forward rerun inside a backward, as checkpointing does, is the
    backward's)."""
    take = probe.take
    if take is None or take.current is None:
        return
    if take.row[take.current].computation_type.value == kind:
        take.inner.setdefault(take.current, []).append(probe.stamp())


def _autograd_timed(fn, probe: _Probe):
    """`torch.autograd.backward` or `.grad`, stamped as a backward's own work."""

    def wrapper(*args, **kwargs):
        take = probe.take
        kind = None
        if take is not None and take.current is not None:
            kind = take.row[take.current].computation_type.value
        if kind not in ("B", "I", "W") or probe.in_autograd:
            return fn(*args, **kwargs)
        spans = take.inner.setdefault(take.current, [])
        probe.in_autograd = True
        spans.append(probe.stamp())
        try:
            return fn(*args, **kwargs)
        finally:
            spans.append(probe.stamp())
            probe.in_autograd = False

    return wrapper


class _RowEvents:
    """One rank's row of one step as timeline events (dicts in pipewright's JSON form), and
    samples of its host time (ms) by what it was spent on."""

    _NEEDS = {"F": "RECV_F", "B": "RECV_B", "I": "RECV_B"}

    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[dict] = []
        self.runtime_ms = 0.0  # PyTorch's own actions, not in pipewright's IR
        self.host: dict[str, list[float]] = {
            k: [] for k in ("action", "send", "recv", "other", "call_f", "call_b", "call_i",
                            "call_w")
        }
        self._posted: set = set()  # receives posted and not yet waited for

    def _event(self, stage: int, kind: Any, mb: int | None, start: float, end: float) -> None:
        self.events.append({"device": self.rank, "start": start, "end": end,
                            "action": {"stage": stage, "kind": kind, "microbatch": mb}})

    def _wait(self, part, start: float, end: float) -> None:
        """The wait for `part`'s input, if a receive was posted for it."""
        needs = self._NEEDS.get(part.computation_type.value)
        key = (needs, part.stage_index, part.microbatch_index)
        if key in self._posted:
            self._posted.discard(key)
            self._event(part.stage_index, needs, part.microbatch_index, start, max(start, end))

    def add(self, action, t0: float, t1: float, spans: list[float],
            inner: list[float] | None = None) -> None:
        """One action that ran from `t0` to `t1`; `spans`: its computes' starts and ends;
        `inner`: the starts and ends of the model's own work in it."""
        kind = action.computation_type.value
        if kind in _COMPUTE or kind == "OVERLAP_F_B":
            parts = action.sub_actions or (action,)
            starts, ends = spans[0::2] or [t0], spans[1::2]
            if kind != "OVERLAP_F_B" and not self._waits(action):
                self.host["action"].append(max(0.0, starts[0] - t0))
            if kind in _COMPUTE and spans:
                # The action's fixed part: its event's time that is not the model's own work.
                own = sum(e - s for s, e in zip((inner or [])[0::2], (inner or [])[1::2]))
                self.host["call_" + kind.lower()].append(max(0.0, t1 - starts[0] - own))
            for k, part in enumerate(parts[: len(starts)]):
                self._wait(part, t0 if k == 0 else ends[k - 1], starts[k])
            if kind == "OVERLAP_F_B":
                f, b = parts
                kind = {"OVERLAP_F_B": {"b_stage": b.stage_index, "b_microbatch": b.microbatch_index}}
                action = f
            self._event(action.stage_index, kind, action.microbatch_index, starts[0], t1)
        elif kind in ("SEND_F", "SEND_B"):
            self._event(action.stage_index, kind, action.microbatch_index, t0, t1)
            self.host["send"].append(t1 - t0)
        elif kind in ("RECV_F", "RECV_B"):
            self._posted.add((kind, action.stage_index, action.microbatch_index))
            self.host["recv"].append(t1 - t0)
        else:
            self.runtime_ms += t1 - t0
            if not kind.startswith("WAIT"):  # a wait is a peer's time, not this host's work
                self.host["other"].append(t1 - t0)

    def _waits(self, part) -> bool:
        """Whether `part` waits for a receive posted earlier (its gap is then partly a wait)."""
        needs = self._NEEDS.get(part.computation_type.value)
        return (needs, part.stage_index, part.microbatch_index) in self._posted


class Recorder:
    """Records real steps of a PyTorch pipeline schedule as pipewright timelines.

    `schedule` is a `_PipelineScheduleRuntime`: from `pipewright.torch.schedule`, one the
    user loaded with `_load_csv`, or PyTorch's own interleaved, looped, zero-bubble and V
    schedules (`ScheduleInterleaved1F1B`, `ScheduleDualPipeV`, ...), which are ones too. Every rank of the pipeline creates its recorder and calls
    `step` for the steps to record; `timelines`, `save_timeline` and `save_costs` gather
    every rank's events and are collective too (rank 0 gets the result and writes files).
    """

    def __init__(self, schedule: Any, *, fence: bool = False):
        rows = getattr(schedule, "pipeline_order_with_comms", None)
        stages = getattr(schedule, "_stages", None)
        if not rows or not stages:
            raise RecordError(
                f"{type(schedule).__name__} runs its own loop, not a timetable: record a "
                "_PipelineScheduleRuntime (pipewright.torch.schedule on `pipewright schedule "
                "-o x.csv` of the same family, PyTorch's interleaved, looped, zero-bubble and "
                "V schedules, or any that has loaded a CSV)"
            )
        self._sched = schedule
        self._fence = fence
        self._group = stages[0].group
        self._rank = schedule.rank
        self._ranks = schedule.pp_group_size
        devices = {torch.device(st.device) for st in stages}
        if len(devices) != 1:
            raise RecordError(f"this rank's stages are on several devices {sorted(map(str, devices))}")
        device = devices.pop()
        self._clock = _CudaClock(device) if device.type == "cuda" else _CpuClock()
        self._probe = _probe_of(schedule)
        self._takes: list = []
        self._steps: list[dict] = []
        self._probe_recorder: Recorder | None = None
        self._ref, self._offset_ms = self._align(device)

    def _align(self, device: torch.device):
        """This rank's clock reference and its offset in ms from the earliest rank's."""
        dist.barrier(group=self._group)
        ref = self._clock.reference()
        cpu = device.type != "cuda"
        mine = (socket.gethostname(), ref if cpu else 0)
        every: list = [None] * self._ranks
        dist.all_gather_object(every, mine, group=self._group)
        if cpu and len({host for host, _ in every}) == 1:
            # One host, one monotonic clock: exact alignment, no barrier's skew.
            return ref, (ref - min(r for _, r in every)) / 1e6
        return ref, 0.0

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """Run `schedule.step(*args, **kwargs)` and record it; returns what it returns."""
        sched = self._sched
        probe = self._probe
        if probe.take is not None:
            raise RecordError("a step is being recorded already: recorders of one schedule take turns")
        row = sched.pipeline_order_with_comms[self._rank]
        if not isinstance(row, _TimedRow):  # (again, if the schedule loaded another timetable)
            row = _TimedRow(row, probe)
            sched.pipeline_order_with_comms[self._rank] = row
        if self._fence:
            if isinstance(self._clock, _CudaClock):
                torch.cuda.synchronize(self._clock.device)
            dist.barrier(group=self._group)
        take = probe.take = _Take(row=list(row), ref=self._ref)
        probe.stamp = self._clock.stamp
        wall = time.perf_counter()
        # PyTorch's stage backward calls these by name: wrapped for this step only.
        backward, grad = torch.autograd.backward, torch.autograd.grad
        torch.autograd.backward = _autograd_timed(backward, probe)
        torch.autograd.grad = _autograd_timed(grad, probe)
        try:
            out = sched.step(*args, **kwargs)
        finally:
            probe.take = None
            torch.autograd.backward, torch.autograd.grad = backward, grad
        wall_ms = (time.perf_counter() - wall) * 1e3
        if len(take.bounds) != len(take.row) + 1:
            raise RecordError(
                f"rank {self._rank}: the runtime did not walk its row as recorded "
                f"({len(take.bounds)} of {len(take.row) + 1} stamps); this PyTorch's "
                "_PipelineScheduleRuntime is not one the recorder knows"
            )
        # Stamps become times only when asked for: no clock conversion (and on a GPU no
        # synchronisation) between the steps being recorded.
        self._takes.append((take, wall_ms))
        return out

    def _events(self, take: _Take, wall_ms: float) -> dict:
        """This rank's events of one step, in ms on the aligned clock."""
        to_ms = lambda stamps: [t + self._offset_ms for t in self._clock.to_ms(take.ref, stamps)]
        bounds = to_ms(take.bounds)
        compute = {i: to_ms(s) for i, s in take.compute.items()}
        inner = {i: to_ms(s) for i, s in take.inner.items()}
        events = _RowEvents(self._rank)
        for i, action in enumerate(take.row):
            events.add(action, bounds[i], bounds[i + 1], compute.get(i, []), inner.get(i, []))
        return {"events": events.events, "runtime_ms": events.runtime_ms, "wall_ms": wall_ms,
                "row_ms": bounds[-1] - bounds[0] if bounds else 0.0, "host": events.host}

    def _claim(self, path: Any, what: str) -> Any:
        """This pipeline's file (on the rank that writes it): `{replica}` in the path becomes
        the pipeline's replica (the global rank of its first process), and a path another
        pipeline of this run (a data-parallel replica) has written is refused, so that replicas
        never race on one file. The claim is kept in the process group's store."""
        replica = dist.get_process_group_ranks(self._group)[0] if self._group else 0
        if isinstance(path, (str, os.PathLike)) and "{replica}" in os.fspath(path):
            path = os.fspath(path).replace("{replica}", str(replica))
        try:
            store = dist.distributed_c10d._get_default_store()
            key = "pipewright.torch/" + os.path.realpath(os.fsdecode(path))
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return path  # no store to ask (or a path write_output will refuse)
        owner = store.compare_set(key, "", str(replica)).decode()
        if owner != str(replica):
            raise RecordError(
                f"{what} {os.fsdecode(path)}: the pipeline of replica {owner} (data parallel) "
                "wrote this file in this run; give each replica its own file, with {replica} in "
                "the path (it becomes the global rank of the pipeline's first process)"
            )
        return path

    @property
    def steps_recorded(self) -> int:
        """Steps this rank has recorded."""
        return len(self._steps) + len(self._takes)

    def _meta(self) -> dict:
        tt = getattr(self._sched, "pipewright_timetable", None)
        return {
            "schedule": tt.name if tt is not None else type(self._sched).__name__,
            "devices": self._ranks,
            "stages": self._sched._num_stages,
            "microbatches": self._sched._n_microbatches,
            "source": "measured",
            "time_unit": "ms",
        }

    def _gather(self) -> list | None:
        self._steps += [self._events(take, wall_ms) for take, wall_ms in self._takes]
        self._takes.clear()
        every: list = [None] * self._ranks
        dist.all_gather_object(every, self._steps, group=self._group)
        if self._rank != 0:
            return None
        counts = {len(s) for s in every}
        if len(counts) != 1:
            raise RecordError(f"ranks recorded different numbers of steps: {[len(s) for s in every]}")
        return every

    def timelines(self) -> list[pipewright.Timeline] | None:
        """Every recorded step as a `pipewright.Timeline`, on rank 0; None elsewhere.

        Collective: every rank of the pipeline calls it. Each step's times start at 0, the
        start of its earliest action on any rank; a timeline shows as its bubble chart in a
        notebook, and `.write(path)` saves it for `pipewright viz --from`.
        """
        every = self._gather()
        return None if every is None else self._timelines_of(every)

    def _timelines_of(self, every: list) -> list[pipewright.Timeline]:
        """The timelines of every rank's gathered steps."""
        out = []
        for k in range(len(every[0])):
            events = [e for rank_steps in every for e in rank_steps[k]["events"]]
            t0 = min((e["start"] for e in events), default=0.0)
            events = [dict(e, start=e["start"] - t0, end=e["end"] - t0) for e in events]
            events.sort(key=lambda e: (e["device"], e["start"]))
            text = json.dumps({"meta": self._meta(), "events": events})
            out.append(pipewright.Timeline.from_json(text))
        return out

    def breakdown(self) -> list[dict] | None:
        """Per step and rank, on rank 0: the walk of the row, PyTorch's own actions, the
        whole `step()` call (ms). Collective, like `timelines`."""
        every = self._gather()
        if every is None:
            return None
        return [
            {"row_ms": [s[k]["row_ms"] for s in every],
             "runtime_ms": [s[k]["runtime_ms"] for s in every],
             "wall_ms": [s[k]["wall_ms"] for s in every]}
            for k in range(len(every[0]))
        ]

    def save_timeline(self, path: str | Path, step: int = -1) -> None:
        """Write one recorded step (default: the last) as a timeline JSON, on rank 0.

        `pipewright viz --from PATH` draws it. Collective.
        """
        tls = self.timelines()
        if tls is None:
            return
        if not tls:
            raise RecordError("no step recorded yet: call Recorder.step first")
        if not -len(tls) <= step < len(tls):
            raise RecordError(f"step {step} was not recorded: {len(tls)} steps were")
        path = self._claim(path, "save_timeline")
        write_output(path, tls[step].to_json(), inputs_of(self._sched), "save_timeline")

    def host_costs(self, *, skip: int | None = None) -> dict | None:
        """The mean host time (ms) of the recorded steps on every rank, on rank 0 (None
        elsewhere), as the cost file's `host`: `action` (from taking a compute action to its
        compute's start, where it waited for no receive), `send` and `recv` (posting one),
        `other` (one of PyTorch's own actions); and `call`, per kind, the median fixed part of
        a compute action: its time less the stage module's own forward (F) or autograd's own
        backward (B, I, W). Steps are skipped as in `save_costs`. Collective."""
        every = self._gather()
        return None if every is None else _host_of(every, skip)

    def probe_split(self, *args: Any, steps: int = 3, **kwargs: Any) -> None:
        """Measure the backward this timetable does not run, on its own stages: `steps` steps
        (the first a warm-up) of the same timetable with each fused backward `B` split in
        place into `I` then `W` (or, when it splits already, each `I` fused into a `B` and its
        `W` dropped), on the same inputs as `step`. `save_costs` then writes `i` and `w`
        beside `b`, each measured (in PyTorch's runtime I + W costs more than B: autograd
        runs twice), so that `search` judges both kinds of schedule by what they cost here.

        The gradients the stages hold are put back as they were: the probe trains nothing.
        Collective; needs a schedule from `pipewright.torch.schedule`."""
        from ._probe import backward_probe

        if not isinstance(steps, int) or isinstance(steps, bool) or not 2 <= steps <= 100:
            raise RecordError(f"steps={steps!r}: give a whole number of steps from 2 to 100")
        tt = getattr(self._sched, "pipewright_timetable", None)
        if tt is None:
            raise RecordError(
                "probe_split needs the timetable of the schedule: build it with "
                "pipewright.torch.schedule"
            )
        probe = backward_probe(tt)
        if probe is None:
            return  # only overlapped F&B cells: nothing to run the other way
        from ._run import schedule as build

        stages = list(self._sched._stages)
        kwargs = {k: v for k, v in kwargs.items() if k != "losses"}
        saved = save_grads(stages)
        try:
            sched = build(probe, stages, loss_fn=self._sched._loss_fn,
                          scale_grads=self._sched.scale_grads)
            rec = Recorder(sched, fence=self._fence)
            for _ in range(steps):
                rec.step(*args, **kwargs)
        finally:
            restore_grads(saved)
        self._probe_recorder = rec

    def save_costs(self, path: str | Path, *, skip: int | None = None) -> None:
        """Write the median per-stage costs, hand-off latency and host time of the recorded
        steps as a cost file, on rank 0; with `probe_split` run first, the split backward's
        `i` and `w` beside the fused `b`.

        The first step is left out as warm-up when there are more (as `train --costs-out`
        does), or the first `skip`. `pipewright search --cost-file PATH` reads it. Collective.
        """
        if skip is not None and (type(skip) is not int or skip < 0):
            raise RecordError(f"skip {skip!r}: give a whole number of steps, 0 or more")
        # One gather of each recorder's steps serves the timelines and the host time.
        every = self._gather()
        probe_every = self._probe_recorder._gather() if self._probe_recorder else None
        if every is None:
            return
        host, tls = _host_of(every, skip), self._timelines_of(every)
        probe = self._probe_recorder._timelines_of(probe_every) if probe_every else None
        if probe_every:  # the fixed parts of the kinds only the probe ran
            host["call"] = {**_host_of(probe_every, 1).get("call", {}), **host.get("call", {})}
        skip = _skip(len(tls), skip)
        used = tls[skip:]
        if not used:
            raise RecordError(f"no step left to measure: {len(tls)} recorded, {skip} skipped")
        costs = measured_costs(used, probe=probe[1:] if probe else None, host=host)
        text = json.dumps(costs, indent=2) + "\n"
        path = self._claim(path, "save_costs")
        write_output(path, text, inputs_of(self._sched), "save_costs")


def _host_of(every: list, skip: int | None) -> dict:
    """The cost file's `host` from every rank's gathered steps (see `Recorder.host_costs`)."""
    skip = _skip(len(every[0]), skip)
    host = {"runtime": "pytorch"}
    for what in ("action", "send", "recv", "other"):
        samples = [x for rank in every for step in rank[skip:] for x in step["host"][what]]
        # A step pays the sum of its host times, so their mean, not their median: the
        # posting of a message has a long tail on a busy host, and the tail is paid too.
        host[what] = statistics.fmean(samples) if samples else 0.0
    # The fixed part sits inside F, B, I and W, whose figures are medians: so is it.
    call = {}
    for kind in "fbiw":
        samples = [x for rank in every for step in rank[skip:]
                   for x in step["host"]["call_" + kind]]
        if samples:
            call[kind] = statistics.median(samples)
    if call:
        host["call"] = call
    return host


def _skip(steps: int, skip: int | None) -> int:
    """Steps to leave out as warm-up: the first when there are more, or `skip`."""
    return int(steps > 1) if skip is None else skip
