"""torchtitan's own pipeline path on one rank of a `torch_worker.py` run (gloo, CPU).

The stages are split by torchtitan's `_pipeline_module_split` and the schedule built by its
`_build_pipeline_schedule` from a `ParallelismConfig` whose `pipeline_parallel_schedule_csv`
is a pipewright timetable, with the settings `pipewright.torch.titan_config` derives. The
model has the structure torchtitan's split expects of its decoders (`tok_embeddings`, a
`layers` ModuleDict, `norm`, `lm_head`, each tolerated missing in `forward`; `_skip_lm_head`
as torchtitan's Decoder), small and in float64 so that one process agrees to rounding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import pipewright.torch as pwt

VOCAB, DIM, SEQ, LAYERS, MB_SIZE = 16, 8, 4, 6, 1
FQNS = ["tok_embeddings", *[f"layers.{i}" for i in range(LAYERS)], "norm", "lm_head"]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(DIM, dtype=torch.float64)
        self.ff = torch.nn.Linear(DIM, DIM, dtype=torch.float64)

    def forward(self, h):
        return h + torch.tanh(self.ff(self.norm(h)))


class TinyDecoder(torch.nn.Module):
    _skip_lm_head = False

    def __init__(self):
        super().__init__()
        torch.manual_seed(31)
        self.tok_embeddings = torch.nn.Embedding(VOCAB, DIM, dtype=torch.float64)
        self.layers = torch.nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = torch.nn.RMSNorm(DIM, dtype=torch.float64)
        with torch.no_grad():  # not ones, so that a lost norm gradient shows
            self.norm.weight.uniform_(0.5, 1.5)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, dtype=torch.float64)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        if self._skip_lm_head or self.lm_head is None:
            return h
        return self.lm_head(h)


def batch(m: int):
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (m * MB_SIZE, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (m * MB_SIZE, SEQ), generator=g)
    return tokens, labels


def make_loss(m: int):
    """torchtitan's loss shape: (pred, labels) -> (loss, metrics), summed over tokens and
    divided by the global token count (torchtitan's schedules run with scale_grads=False)."""
    tokens = m * MB_SIZE * SEQ

    def loss_fn(pred, labels):
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), labels.flatten(),
                                                 reduction="sum")
        return loss / tokens, {}

    return loss_fn


def reference_grads(m: int) -> dict[str, torch.Tensor]:
    model = TinyDecoder()
    tokens, labels = batch(m)
    make_loss(m)(model(tokens), labels)[0].backward()
    return {n: p.grad for n, p in model.named_parameters()}


_MESH = {}


def _mesh(p: int):
    """("dp", "pp") of 1 x p, as torchtitan's ParallelDims makes with no data parallelism."""
    from torch.distributed.device_mesh import init_device_mesh

    if p not in _MESH:
        _MESH[p] = init_device_mesh("cpu", (1, p), mesh_dim_names=("dp", "pp"))
    return _MESH[p]


def _fully_shard(part, dp_mesh) -> None:
    """FSDP2 on each module of a model part and on the part, as torchtitan's parallelize
    functions apply it to every part `pipeline_llm` splits off."""
    from torch.distributed.fsdp import fully_shard

    for name, module in list(part.named_children()):
        if module is None:
            continue
        for sub in (module.values() if name == "layers" else [module]):
            fully_shard(sub, mesh=dp_mesh)
    fully_shard(part, mesh=dp_mesh)


def build(case, loss_fn=None, fsdp: bool = False):
    """torchtitan's split and schedule on this rank; returns (cfg, stages, parts, schedule)."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.pipeline_parallel import (
        _build_pipeline_schedule,
        _pipeline_module_split,
    )

    m = pwt.load(case["timetable"]).microbatches
    cfg = pwt.titan_config(case["timetable"], FQNS, local_batch_size=m * MB_SIZE)
    parallelism = ParallelismConfig(**cfg.fields())
    pwt.check_titan_config(case["timetable"], parallelism, local_batch_size=m * MB_SIZE)
    stages, parts = _pipeline_module_split(
        TinyDecoder(), _mesh(cfg.degree)["pp"], cfg.schedule, torch.device("cpu"),
        parallelism.module_fqns_per_model_part,
    )
    for st, part in zip(stages, parts):
        if fsdp:
            _fully_shard(part, _mesh(cfg.degree)["dp"])
        if st.is_last and hasattr(loss_fn, "set_lm_head"):  # as torchtitan's trainer does
            loss_fn.set_lm_head(part.lm_head)
            part._skip_lm_head = True
    sched = _build_pipeline_schedule(parallelism=parallelism, local_batch_size=m * MB_SIZE,
                                     stages=stages, loss_fn=loss_fn or make_loss(m))
    return cfg, stages, parts, sched


def step(stages, sched, m: int):
    tokens, labels = batch(m)
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    args = (tokens,) if first else ()
    kwargs = {"target": labels, "losses": []} if last else {}
    sched.step(*args, **kwargs)


def case_titan(case, group):
    """One step on torchtitan's path: every gradient against one process, by FQN."""
    cfg, stages, parts, sched = build(case)
    rank = dist.get_rank(group)
    built = tuple(st.stage_index for st in stages)
    step(stages, sched, cfg.microbatches)
    pwt.check_grads(stages)
    mine = {n: p.grad for part in parts for n, p in part.named_parameters()}
    every: list = [None] * cfg.degree
    dist.all_gather_object(every, (built, mine), group=group)
    if rank != 0:
        return None
    want = reference_grads(cfg.microbatches)
    got = {n: g for _, part in every for n, g in part.items()}
    err = max((got[n] - want[n]).abs().max().item() for n in want)
    return {"max_grad_err": err, "missing": sorted(set(want) - set(got)),
            "built": [list(b) for b, _ in every],
            "derived": [list(s) for s in cfg.stage_indices], "schedule": cfg.schedule,
            "stages": cfg.num_stages}


def chunked_reference(m: int) -> dict[str, torch.Tensor]:
    """One process, torchtitan's chunked loss in its terms: cross-entropy summed over every
    token in float32 (scale_grads=False: the microbatches' losses add up)."""
    model = TinyDecoder()
    tokens, labels = batch(m)
    logits = model(tokens).flatten(0, 1).float()
    torch.nn.functional.cross_entropy(logits, labels.flatten(), reduction="sum").backward()
    return {n: p.grad for n, p in model.named_parameters()}


def case_titan_chunked(case, group):
    """torchtitan's ChunkedLossWrapper (lm_head inside the loss) with FSDP on every part:
    check_grads must name a parameter left without a gradient, or with one unlike one
    process's; a fused backward passes both checks."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    wrapper = ChunkedLossWrapper(ChunkedLossWrapper.Config(
        num_chunks=2, loss_fn=CrossEntropyLoss.Config()))
    cfg, stages, parts, sched = build(case, loss_fn=wrapper, fsdp=True)
    step(stages, sched, cfg.microbatches)
    refusal = None
    for reference in (None, chunked_reference(cfg.microbatches)):
        try:
            pwt.check_grads(stages, reference=reference, rtol=1e-4, atol=1e-6)
        except pwt.GradError as e:
            refusal = str(e)
            break
    every: list = [None] * cfg.degree
    dist.all_gather_object(every, refusal, group=group)
    return {"refusals": every} if dist.get_rank(group) == 0 else None
