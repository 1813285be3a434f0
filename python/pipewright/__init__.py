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

from ._native import (
    ArgumentError,
    Chart,
    Costs,
    PipewrightError,
    Plan,
    Report,
    SearchResult,
    Shape,
    Simulation,
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

__all__ = [
    "ArgumentError",
    "Chart",
    "Costs",
    "PipewrightError",
    "Plan",
    "Report",
    "SearchResult",
    "Shape",
    "Simulation",
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
