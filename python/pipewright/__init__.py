"""pipewright: pipeline-parallel schedules as data.

Timetables are generated, validated, simulated, searched and planned by pipewright's Rust
crates (this package calls them; nothing is computed twice), read and written in PyTorch's
pipelining CSV forms, and drawn as bubble charts that show inline in a notebook.

    >>> import pipewright as pw
    >>> tt = pw.generate("interleaved-1f1b", p=4, v=2, m=8)
    >>> sim = pw.simulate(tt, pw.Costs(f=1.0, b=2.0))
    >>> round(sim.report.bubble_fraction, 4)   # (p-1)/(v*m+p-1) = 3/19
    0.1579
    >>> open("schedule.csv", "w").write(tt.to_csv())   # PyTorch's _load_csv reads it

Errors are `PipewrightError` (a `ValueError`) with the CLI's one-line message; an argument
of the wrong type or out of its range is an `ArgumentError` (a `PipewrightError` and a
`TypeError`) naming it: `gpus: -8 is out of range: give a whole number from 0 to 4294967295`.
`search` and `sweep` release the GIL and stop on Ctrl-C.
"""

import functools as _functools

from ._native import (
    ArgumentError,
    Bubbles,
    Candidate,
    Chart,
    Costs,
    CutShort,
    DeviceReport,
    MemoryPeak,
    PipewrightError,
    Plan,
    PlanConfig,
    PlanRow,
    Report,
    SearchResult,
    Shape,
    Simulation,
    Skipped,
    SteadySimulation,
    SweepRow,
    Timeline,
    Timetable,
    Validated,
    __version__,
    chart,
    generate,
    plan,
    search,
    simulate,
    sweep,
    validate,
)



def _named(function):
    """`function` with PyO3's own conversion errors (a str where a list is wanted, an int
    where a str is) raised as `ArgumentError`, whose message leads with the argument's name
    (PyO3 notes it as `while processing 'x'`, which `str(error)` does not show)."""

    @_functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except TypeError as e:
            notes = getattr(e, "__notes__", ())
            if isinstance(e, ArgumentError) or not any(n.startswith("while processing '") for n in notes):
                raise
            named = ArgumentError(str(e))
            for note in notes:
                named.add_note(note)
            raise named from None

    return call


chart, generate, plan, search, simulate, sweep, validate = map(
    _named, (chart, generate, plan, search, simulate, sweep, validate)
)

__all__ = [
    "ArgumentError",
    "Bubbles",
    "Candidate",
    "Chart",
    "Costs",
    "CutShort",
    "DeviceReport",
    "MemoryPeak",
    "PipewrightError",
    "Plan",
    "PlanConfig",
    "PlanRow",
    "Report",
    "SearchResult",
    "Shape",
    "Simulation",
    "Skipped",
    "SteadySimulation",
    "SweepRow",
    "Timeline",
    "Timetable",
    "Validated",
    "__version__",
    "chart",
    "generate",
    "plan",
    "search",
    "simulate",
    "sweep",
    "validate",
]
