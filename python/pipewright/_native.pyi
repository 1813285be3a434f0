"""Type stubs of `pipewright._native`, the Rust crates seen from Python."""

from os import PathLike
from typing import Any, Iterable, Literal, Optional, Sequence, Union, final

# PyO3's own list, in the order the module registers them.
__all__ = [
    "PipewrightError",
    "__version__",
    "ArgumentError",
    "Timetable",
    "Validated",
    "generate",
    "validate",
    "Costs",
    "Timeline",
    "Report",
    "Simulation",
    "SteadySimulation",
    "simulate",
    "Chart",
    "chart",
    "SearchResult",
    "SweepRow",
    "search",
    "sweep",
    "Plan",
    "plan",
    "Bubbles",
    "Candidate",
    "Skipped",
    "CutShort",
    "MemoryPeak",
    "DeviceReport",
    "PlanConfig",
    "PlanRow",
    "Shape",
    "cli_main",
]

__version__: str

_CsvForm = Literal["compute_only", "compute_comms", "lowered"]
_ImageFormat = Literal["svg", "png"]
_StrPath = Union[str, "PathLike[str]"]
# A file's path, its JSON text (starting with `{`), or its JSON as a dict.
_JsonSource = Union[str, "PathLike[str]", dict[str, Any]]
_Precision = Literal["bf16", "tf32", "f32"]
_Accounting = Literal["pipewright", "megatron"]
_Attention = Literal["materialized", "fused"]

class PipewrightError(ValueError):
    """A request pipewright refuses, with the one line the CLI prints after `error:`, each field
    written as the keyword passed (`kv_heads=3`) where the CLI writes its flag."""

class ArgumentError(PipewrightError, TypeError):
    """An argument of the wrong type or out of its range, named with what is accepted:
    `gpus: -8 is out of range: give a whole number from 0 to 4294967295`. Whole numbers
    take an int (or numpy integer), never a bool or a float; numbers take an int or a float."""

@final
class Timetable:
    """One training step: for each device, the actions it runs, in order."""

    @staticmethod
    def from_csv(text: str, validate: bool = True) -> Timetable:
        """CSV in any form (PyTorch's compute-only or compute+comms, pipewright's lowered)."""
    @staticmethod
    def from_json(text: str, validate: bool = True) -> Timetable: ...
    @staticmethod
    def read(path: _StrPath, validate: bool = True) -> Timetable: ...
    def to_csv(self, form: _CsvForm = "compute_only") -> str:
        """PyTorch's compute-only or compute+comms form, or pipewright's lowered rows (lowered
        here, sends and receives included, when the timetable is not yet)."""
    def to_json(self) -> str: ...
    def write(self, path: _StrPath, comms: bool = False) -> None:
        """`.csv` (compute-only; compute+comms with `comms=True`) or `.json`, atomically."""
    def lower(self) -> Timetable: ...
    def compute_only(self) -> Timetable: ...
    def grid(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def microbatches(self) -> int: ...
    @property
    def devices(self) -> int: ...
    @property
    def stages(self) -> int: ...
    @property
    def stage_device(self) -> list[int]: ...
    @property
    def rows(self) -> list[list[str]]: ...
    @property
    def lowered(self) -> bool: ...
    @property
    def csv_form(self) -> Optional[_CsvForm]: ...
    def __len__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool:
        """Equal content (microbatches, stage placement, every device's actions); the name
        is a label, so a timetable equals itself read back from its own CSV."""

@final
class Validated:
    @property
    def compute_actions(self) -> int: ...
    @property
    def lowered(self) -> bool: ...

def generate(
    schedule: str = "1f1b",
    p: int = 4,
    v: int = 1,
    m: int = 8,
    group_size: Optional[int] = None,
    recompute: str = "none",
) -> Timetable:
    """A family's timetable: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zbv,
    dualpipev."""

def validate(timetable: Timetable, rendezvous: bool = False) -> Validated:
    """Complete, ordered, paired and deadlock-free, or `PipewrightError` naming where."""

@final
class Costs:
    """Durations, sizes and link speed for the simulator."""

    def __new__(
        cls,
        f: float = 1.0,
        b: float = 2.0,
        w: Optional[float] = None,
        activation_bytes: Union[int, str, None] = None,
        p2p_bytes: Union[int, str, None] = None,
        p2p_latency: Optional[float] = None,
        bandwidth: Optional[float] = None,
        w_memory: Optional[float] = None,
    ) -> Costs:
        """`activation_bytes` and `p2p_bytes` (default 0): bytes, or with a unit (`"1MiB"`)."""
    @staticmethod
    def from_json(text: str) -> Costs: ...
    @staticmethod
    def read(path: _StrPath) -> Costs: ...
    @staticmethod
    def from_timelines(
        timelines: Sequence[Timeline],
        probe: Optional[Sequence[Timeline]] = None,
        host: Optional[dict[str, Any]] = None,
    ) -> Costs:
        """Medians over steps of one pipeline (a timeline whose schedule, devices, stages or
        microbatches differ from the first's is refused naming the field); `probe`:
        split-backward steps of the same stages (`i`, `w` beside `b`); `host`: the cost
        file's `host` (runtime, action, send, recv, other)."""
    def with_overrides(
        self,
        p2p_latency: Optional[float] = None,
        bandwidth: Optional[float] = None,
        w_memory: Optional[float] = None,
    ) -> Costs: ...
    def model_dict(self, stages: int, devices: int) -> dict[str, Any]: ...
    def to_json(self, stages: Optional[int] = None, devices: Optional[int] = None) -> str: ...

@final
class Chart:
    """SVG or PNG bytes; shows as itself in a notebook."""

    @property
    def data(self) -> bytes: ...
    @property
    def format(self) -> _ImageFormat: ...
    def save(self, path: _StrPath) -> None: ...
    def _repr_svg_(self) -> Optional[str]: ...
    def _repr_png_(self) -> Optional[bytes]: ...
    def __len__(self) -> int: ...

@final
class Timeline:
    """Every event of a step, simulated or measured."""

    @staticmethod
    def from_json(text: str) -> Timeline:
        """Checked as `pipewright viz --from` checks a timeline (errors call the text `json`)."""
    @staticmethod
    def read(path: _StrPath) -> Timeline:
        """Read and checked as `pipewright viz --from` reads it, naming the file."""
    def to_json(self) -> str: ...
    def write(self, path: _StrPath) -> None: ...
    def to_chrome_trace(self) -> str: ...
    @property
    def meta(self) -> dict[str, Any]: ...
    @property
    def events(self) -> list[dict[str, Any]]: ...
    @property
    def makespan(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    def chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Chart: ...
    def __len__(self) -> int: ...
    def _repr_svg_(self) -> str: ...

@final
class Report:
    @property
    def makespan(self) -> float: ...
    @property
    def ideal(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def devices(self) -> list[DeviceReport]: ...
    def to_dict(self) -> dict[str, Any]: ...

# Records inside the results above: typed attributes, and `to_dict()` (the dict each was
# before) with `r["key"]` and `r == dict` kept for code written against those dicts.
@final
class Bubbles:
    """Bubble fractions, each `1 - ideal / time` for one notion of a step's time."""

    @property
    def single_step(self) -> float: ...
    @property
    def steady_state(self) -> float: ...
    @property
    def largest_span(self) -> float: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class Candidate:
    """One timetable `search` evaluated."""

    @property
    def label(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def virtual_stages(self) -> int: ...
    @property
    def makespan(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def period(self) -> float: ...
    @property
    def bubble(self) -> Bubbles: ...
    @property
    def peak_microbatches(self) -> float: ...
    @property
    def peak_bytes(self) -> Optional[int]: ...
    @property
    def fits(self) -> bool: ...
    @property
    def recomputes(self) -> int: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class Skipped:
    """A shape `search` could not try, and why."""

    @property
    def label(self) -> str: ...
    @property
    def reason(self) -> str: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class CutShort:
    """A search its time budget stopped early."""

    @property
    def budget_seconds(self) -> float: ...
    @property
    def evaluated(self) -> int: ...
    @property
    def total(self) -> int: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class MemoryPeak:
    """One device's memory, bytes by category and their `total`."""

    @property
    def parameters(self) -> int: ...
    @property
    def gradients(self) -> int: ...
    @property
    def optimizer_state(self) -> int: ...
    @property
    def activations(self) -> int: ...
    @property
    def buffers(self) -> int: ...
    @property
    def workspace(self) -> int: ...
    @property
    def total(self) -> int: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class DeviceReport:
    """One device's figures in a simulated step."""

    @property
    def device(self) -> int: ...
    @property
    def busy(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def peak_activations(self) -> int: ...
    @property
    def peak_activation_bytes(self) -> int: ...
    @property
    def memory(self) -> list[tuple[float, int, int]]: ...
    @property
    def comm(self) -> float: ...
    @property
    def comm_hidden(self) -> float: ...
    @property
    def comm_hidden_share(self) -> float: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class PlanConfig:
    """One configuration of a plan: how the GPUs are split and the schedule run."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def v(self) -> int: ...
    @property
    def microbatch_size(self) -> int: ...
    @property
    def microbatches(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def recompute(self) -> str: ...
    @property
    def recompute_devices(self) -> int: ...
    @property
    def zero(self) -> int: ...
    @property
    def sequence_parallel(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class PlanRow:
    """One ranked configuration of a plan with its predicted figures."""

    @property
    def config(self) -> PlanConfig: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def tokens_per_s(self) -> Optional[float]: ...
    @property
    def samples_per_s(self) -> float: ...
    @property
    def tflops_per_gpu(self) -> Optional[float]: ...
    @property
    def mfu(self) -> Optional[float]: ...
    @property
    def peak_memory_bytes(self) -> int: ...
    @property
    def headroom_bytes(self) -> int: ...
    @property
    def memory(self) -> list[MemoryPeak]: ...
    @property
    def bubble(self) -> float: ...
    @property
    def bound_s(self) -> float: ...
    @property
    def terms(self) -> Optional[dict[str, Any]]: ...
    @property
    def limit(self) -> Optional[dict[str, Any]]: ...
    @property
    def searched(self) -> Optional[dict[str, Any]]: ...
    def to_dict(self) -> dict[str, Any]:
        """The record as the dict it was before it was a class (the CLI's JSON)."""
    def __getitem__(self, key: str, /) -> Any:
        """`r["key"]`, kept for code written when this was a dict: `to_dict()[key]`."""
    def __eq__(self, other: object, /) -> bool:
        """Equal records, or a dict equal to `to_dict()`."""

@final
class Shape:
    """A GPT's shape: sizes and kinds (GPT-2's unless given), or a Hugging Face config."""

    def __new__(
        cls,
        layers: int,
        d_model: int,
        heads: int,
        seq_len: int,
        vocab: int,
        *,
        ffn: Optional[int] = None,
        kv_heads: Optional[int] = None,
        mlp: Optional[Literal["gelu", "swiglu", "geglu"]] = None,
        norm: Optional[Literal["layernorm", "rmsnorm"]] = None,
        tied_embeddings: bool = False,
        positions: Optional[Literal["learned", "rotary"]] = None,
        rope_theta: Optional[float] = None,
        bias: Optional[Literal["all", "qkv", "none"]] = None,
        experts: Optional[int] = None,
        top_k: Optional[int] = None,
        expert_ffn: Optional[int] = None,
        shared_experts: Optional[int] = None,
        shared_ffn: Optional[int] = None,
        dense_layers: Optional[int] = None,
        moe_every: Optional[int] = None,
        expert_groups: Optional[int] = None,
        groups_per_token: Optional[int] = None,
    ) -> Shape: ...
    @staticmethod
    def from_hf_config(config: _JsonSource, seq_len: Optional[int] = None) -> Shape:
        """llama, mistral, qwen2, gpt2, gpt_neox, mixtral, qwen2_moe, qwen3_moe, deepseek_v3,
        as `--hf-config` reads them."""
    @property
    def layers(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def ffn(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def parameters(self) -> int: ...
    @property
    def active_parameters(self) -> int: ...
    @property
    def notes(self) -> list[str]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Simulation:
    @property
    def timeline(self) -> Timeline: ...
    @property
    def report(self) -> Report: ...
    @property
    def predicted_memory(self) -> Optional[list[MemoryPeak]]: ...
    def chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Chart: ...
    def _repr_svg_(self) -> str: ...

@final
class SteadySimulation:
    @property
    def timeline(self) -> Timeline: ...
    @property
    def single(self) -> Simulation: ...
    @property
    def predicted_memory(self) -> Optional[list[MemoryPeak]]: ...
    @property
    def steps(self) -> int: ...
    @property
    def period(self) -> float: ...
    @property
    def single_step_makespan(self) -> float: ...
    @property
    def step_makespans(self) -> list[float]: ...
    @property
    def bubble(self) -> Bubbles: ...
    def to_dict(self) -> dict[str, Any]: ...
    def chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Chart: ...
    def _repr_svg_(self) -> str: ...

def simulate(
    timetable: Timetable,
    costs: Optional[Costs] = None,
    steps: int = 1,
    *,
    shape: Optional[Shape] = None,
    tp: Optional[int] = None,
    dp: Optional[int] = None,
    zero: Optional[int] = None,
    microbatch_size: Optional[int] = None,
    sequence_parallel: bool = False,
    precision: Optional[_Precision] = None,
    accounting: Optional[_Accounting] = None,
    attention: Optional[_Attention] = None,
) -> Union[Simulation, SteadySimulation]:
    """One step (`Simulation`), or `steps` unfenced steps (`SteadySimulation`); with a
    `shape`, each device's predicted memory (`predicted_memory`)."""

def chart(
    timelines: Sequence[Timeline],
    labels: Optional[Sequence[str]] = None,
    format: _ImageFormat = "svg",
    width: int = 1200,
    height: Optional[int] = None,
    title: Optional[str] = None,
) -> Chart: ...

@final
class SearchResult:
    @property
    def timetable(self) -> Timetable: ...
    @property
    def simulation(self) -> Simulation: ...
    @property
    def seconds(self) -> float: ...
    @property
    def predicted_memory(self) -> Optional[list[MemoryPeak]]: ...
    @property
    def best(self) -> Candidate: ...
    @property
    def best_fixed(self) -> Optional[Candidate]: ...
    @property
    def candidates(self) -> list[Candidate]: ...
    @property
    def front(self) -> list[Candidate]: ...
    @property
    def skipped(self) -> list[Skipped]: ...
    @property
    def cut_short(self) -> Optional[CutShort]: ...
    @property
    def cap_microbatches(self) -> float: ...
    def timetables(self, k: int = 5) -> list[Timetable]:
        """The best and the next fitting timetables, fastest first, up to `k` (at most 5)."""
    def chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Chart: ...
    def pareto_chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Chart: ...
    def _repr_svg_(self) -> str: ...

def search(
    p: int,
    m: int,
    memory_cap: Union[int, float, str],
    costs: Optional[Costs] = None,
    max_virtual: int = 4,
    schedules: Optional[Sequence[str]] = None,
    list_scheduler: bool = True,
    improve: int = 200,
    objective: Literal["period", "makespan"] = "period",
    time_budget: float = 30.0,
    *,
    split_backward: bool = True,
    shape: Optional[Shape] = None,
    tp: Optional[int] = None,
    dp: Optional[int] = None,
    zero: Optional[int] = None,
    microbatch_size: Optional[int] = None,
    sequence_parallel: bool = False,
    precision: Optional[_Precision] = None,
    accounting: Optional[_Accounting] = None,
    attention: Optional[_Attention] = None,
) -> SearchResult:
    """With a `shape`, a cap in bytes bounds each rank's whole predicted memory.
    `time_budget` is 0 to 3600 s; runs with the GIL released and stops on Ctrl-C."""

@final
class SweepRow:
    @property
    def schedule(self) -> str: ...
    @property
    def virtual_stages(self) -> int: ...
    @property
    def microbatches(self) -> int: ...
    @property
    def makespan(self) -> Optional[float]: ...
    @property
    def bubble_fraction(self) -> Optional[float]: ...
    @property
    def period(self) -> Optional[float]: ...
    @property
    def throughput(self) -> Optional[float]: ...
    @property
    def peak_activations(self) -> Optional[int]: ...
    @property
    def peak_activation_bytes(self) -> Optional[int]: ...
    @property
    def fits(self) -> Optional[bool]: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def bubble(self) -> Optional[Bubbles]: ...
    def to_dict(self) -> dict[str, Any]:
        """The row as a dict (what `sweep --format json` gives per row)."""

def sweep(
    p: int = 4,
    m: Iterable[int] = ...,
    schedules: Optional[Sequence[str]] = None,
    v: Optional[Iterable[int]] = None,
    costs: Optional[Costs] = None,
    memory_cap: Union[int, float, str, None] = None,
) -> list[SweepRow]:
    """`m` defaults to [4, 8, 16, 32, 64]; `memory_cap` in microbatches (`4`) or bytes with a unit (`"24GiB"`), as `search`'s.
    A grid past the CLI's sweep limit is refused; runs with the GIL released and stops on
    Ctrl-C."""

@final
class Plan:
    @property
    def seconds(self) -> float: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def rows(self) -> list[PlanRow]: ...
    @property
    def best(self) -> Optional[PlanRow]: ...
    @property
    def explain(self) -> list[str]: ...
    @property
    def cut_short(self) -> bool: ...
    @property
    def timetable(self) -> Optional[Timetable]: ...
    @property
    def model(self) -> str: ...
    @property
    def parameters(self) -> Optional[int]: ...
    def chart(
        self,
        format: _ImageFormat = "svg",
        width: int = 1200,
        height: Optional[int] = None,
        title: Optional[str] = None,
    ) -> Optional[Chart]:
        """The best's simulated step with its predicted memory, as `plan --chart` draws it."""
    def launch(self, timetable: Optional[_StrPath] = None) -> Optional[str]:
        """How to run the best, as `pipewright plan` prints it under "run the best:"."""
    def to_dict(self) -> dict[str, Any]:
        """What `pipewright plan --format json` prints."""
    def __len__(self) -> int: ...

def plan(
    layers: Optional[int] = None,
    d_model: Optional[int] = None,
    heads: Optional[int] = None,
    seq_len: Optional[int] = None,
    gpus: Optional[int] = None,
    global_batch: Optional[int] = None,
    *,
    vocab: Optional[int] = None,
    ffn: Optional[int] = None,
    kv_heads: Optional[int] = None,
    mlp: Optional[Literal["gelu", "swiglu", "geglu"]] = None,
    norm: Optional[Literal["layernorm", "rmsnorm"]] = None,
    tied_embeddings: bool = False,
    positions: Optional[Literal["learned", "rotary"]] = None,
    rope_theta: Optional[float] = None,
    bias: Optional[Literal["all", "qkv", "none"]] = None,
    experts: Optional[int] = None,
    top_k: Optional[int] = None,
    expert_ffn: Optional[int] = None,
    shared_experts: Optional[int] = None,
    shared_ffn: Optional[int] = None,
    dense_layers: Optional[int] = None,
    moe_every: Optional[int] = None,
    expert_groups: Optional[int] = None,
    groups_per_token: Optional[int] = None,
    hf_config: Optional[_JsonSource] = None,
    profile: Optional[_JsonSource] = None,
    attention: Optional[_Attention] = None,
    cluster: str = "a100-80g",
    precision: _Precision = "bf16",
    tp: Optional[int] = None,
    pp: Optional[int] = None,
    v: Optional[int] = None,
    microbatch_size: Optional[int] = None,
    schedule: Optional[str] = None,
    recompute: Optional[str] = None,
    zero: Optional[int] = None,
    sequence_parallel: Optional[bool] = None,
    ep: Optional[int] = None,
    etp: Optional[int] = None,
    capacity_factor: float = 1.0,
    dispatcher: Literal["all-to-all", "deepep"] = "all-to-all",
    fp8: bool = False,
    allow_cross_node_tp: bool = False,
    top: int = 5,
    max_virtual: int = 8,
    max_microbatch_size: int = 16,
    max_simulated: int = 200,
    max_searched: int = 2,
) -> Plan:
    """`pipewright plan`: every keyword is its flag of the same name, checked in its words."""
def cli_main(argv: list[str], self_command: list[str]) -> int:
    """The `pipewright` command line (`argv[0]` the program's name); returns its exit status.
    `self_command` runs the command again (`plan --validate` runs `train` as a child). It does
    not check Python's signal handlers: `pipewright._cli.main` restores Ctrl-C's default first."""
