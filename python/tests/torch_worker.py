"""One rank of a multi-process PyTorch test run: `python torch_worker.py SPEC.json`.

The launcher (`torch_launch.py`) starts one process per rank with RANK, WORLD_SIZE and
MASTER_PORT set. Every process runs the spec's cases in order; a case of p ranks runs on the
first p processes (a subgroup), the others wait at the barrier that ends each case. Rank 0
writes one result per case to the spec's `out` file.

The model is a chain of stages, each a Linear(d, d) + Tanh seeded by its stage index, in
float64 so that one process and the pipeline agree to rounding; the loss is the mean
squared error against a seeded target.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import pipewright.torch as pwt

D, MB_SIZE = 8, 2


class TinyMoE(torch.nn.Module):
    """A user's mixture-of-experts stage: a softmax router, top-2 gates renormalised over the
    two (Mixtral's), four Linear-Tanh-Linear experts, and a residual."""

    def __init__(self, experts: int = 4, top_k: int = 2):
        super().__init__()
        f64 = torch.float64
        self.router = torch.nn.Linear(D, experts, bias=False, dtype=f64)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(D, 2 * D, dtype=f64), torch.nn.Tanh(),
                                torch.nn.Linear(2 * D, D, dtype=f64))
            for _ in range(experts))
        self.top_k = top_k

    def forward(self, x):
        gates, chosen = torch.softmax(self.router(x), -1).topk(self.top_k, -1)
        gates = gates / gates.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            hit = chosen == e
            rows = hit.any(-1).nonzero().squeeze(-1)
            if rows.numel():
                gate = (gates * hit).sum(-1, keepdim=True)[rows]
                out = out.index_add(0, rows, gate * expert(x[rows]))
        return x + out


def stage_module(stage: int, sleep_ms: float = 0.0, model: str = "linear") -> torch.nn.Module:
    torch.manual_seed(1000 + stage)
    if model == "moe":
        return TinyMoE()
    layers = [torch.nn.Linear(D, D, dtype=torch.float64), torch.nn.Tanh()]
    if sleep_ms:
        layers.append(pwt.Sleep(sleep_ms))
    return torch.nn.Sequential(*layers)


def batch(m: int, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m * MB_SIZE, D, generator=g, dtype=torch.float64)
    y = torch.randn(m * MB_SIZE, D, generator=g, dtype=torch.float64)
    return x, y


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def grads_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """Each parameter's gradient; zeros for one no microbatch reached (an expert no token
    was routed to), in the pipeline and the reference alike."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in module.parameters()]


def reference_grads(stages: int, m: int, model_kind: str = "linear") -> dict[int, list[torch.Tensor]]:
    """One process: the whole model, the mean of the microbatches' losses."""
    model = torch.nn.Sequential(*[stage_module(s, model=model_kind) for s in range(stages)])
    x, y = batch(m)
    loss = sum(loss_fn(model(xm), ym) for xm, ym in zip(x.chunk(m), y.chunk(m))) / m
    loss.backward()
    return {s: grads_of(model[s]) for s in range(stages)}


def run_pipeline(case, group, recorder_steps: int = 0):
    """Build this rank's stages, run the case's steps; return (stages, schedule, losses)."""
    tt = pwt.load(case["timetable"], form=case.get("form"))
    sleep_ms = case.get("sleep_ms", 0.0)
    model = case.get("model", "linear")
    stages = pwt.pipeline_stages(tt, lambda s: stage_module(s, sleep_ms, model), group=group)
    sched = pwt.schedule(tt, stages, loss_fn=loss_fn)
    x, y = batch(tt.microbatches)
    losses: list = []
    for _ in range(case.get("steps", 1)):
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        losses = []
        sched.step(x, target=y, losses=losses)
    return tt, stages, sched, losses


def case_grads(case, group):
    tt, stages, _, losses = run_pipeline(case, group)
    mine = {st.stage_index: grads_of(st.submod) for st in stages}
    everything: list = [None] * tt.num_ranks
    dist.all_gather_object(everything, mine, group=group)
    if dist.get_rank(group) != 0:
        return None
    got = {s: g for part in everything for s, g in part.items()}
    want = reference_grads(tt.num_stages, tt.microbatches, case.get("model", "linear"))
    err = max(
        (a - b).abs().max().item() for s in want for a, b in zip(got[s], want[s])
    )
    return {"max_grad_err": err, "stages": tt.num_stages, "ranks": tt.num_ranks}


def case_record(case, group):
    """Record `steps` steps (after `warmup` unrecorded ones); write timelines and costs."""
    tt = pwt.load(case["timetable"], form=case.get("form"))
    sleep_ms = case.get("sleep_ms", 0.0)
    model = case.get("model", "linear")
    stages = pwt.pipeline_stages(tt, lambda s: stage_module(s, sleep_ms, model), group=group)
    sched = pwt.schedule(tt, stages, loss_fn=loss_fn)
    rec = pwt.Recorder(sched)
    x, y = batch(tt.microbatches)
    for _ in range(case.get("warmup", 1)):
        sched.step(x, target=y)
    for _ in range(case.get("steps", 3)):
        rec.step(x, target=y)
    kept = True
    if case.get("probe"):
        before = [p.grad.clone() for st in stages for p in st.submod.parameters()]
        rec.probe_split(x, target=y)
        after = [p.grad for st in stages for p in st.submod.parameters()]
        kept = all(torch.equal(a, b) for a, b in zip(before, after))
    out = Path(case["out_dir"])
    rec.save_timeline(out / "timeline.json")
    rec.save_costs(out / "costs.json", skip=0)
    tls = rec.timelines()
    breakdown = rec.breakdown()
    every: list = [None] * tt.num_ranks
    dist.all_gather_object(every, kept, group=group)
    if tls is None:
        return None
    for k, tl in enumerate(tls):
        (out / f"step{k}.json").write_text(tl.to_json())
    return {"steps": len(tls), "breakdown": breakdown, "probe_kept_grads": all(every)}


def case_record_torch(case, group):
    """Record one of PyTorch's own schedule classes, unchanged; dump its compute-only rows."""
    from torch.distributed.pipelining import PipelineStage, schedules

    p, m, v = case["p"], case["m"], 2
    rank = dist.get_rank(group)
    cls = getattr(schedules, case["class"])
    mine = [rank, 2 * p - 1 - rank] if case["placement"] == "v" else [rank, rank + p]
    stages = [PipelineStage(stage_module(s, case.get("sleep_ms", 0.0)), s, p * v,
                            torch.device("cpu"), group=group) for s in sorted(mine)]
    sched = cls(stages, n_microbatches=m, loss_fn=loss_fn)
    rec = pwt.Recorder(sched)
    x, y = batch(m)
    sched.step(x, target=y)
    for _ in range(2):
        rec.step(x, target=y)
    out = Path(case["out_dir"])
    rec.save_timeline(out / "timeline.json")
    rec.save_costs(out / "costs.json")
    if rank == 0:
        sched._dump_csv(str(out / "torch.csv"), format="compute_only")
    return {"stages": stages[0].num_stages} if rank == 0 else None


def case_tune(case, group):
    """Tune over the case's timetables (the baseline first) on this rank's stages."""
    sleep_ms = case.get("sleep_ms", 0.0)
    built = []

    def build(tt):
        stages = pwt.pipeline_stages(tt, lambda s: stage_module(s, sleep_ms), group=group)
        for st in stages:  # gradients held before tuning, which it must put back
            for p in st.submod.parameters():
                p.grad = torch.full_like(p, 0.5)
        built.append(stages)
        return pwt.schedule(tt, stages, loss_fn=loss_fn)

    m = pwt.load(case["timetables"][0]).microbatches
    x, y = batch(m)
    result = pwt.tune(case["timetables"], build, x, target=y, steps=case.get("steps", 3),
                      costs=case.get("costs"), group=group)
    untouched = all(p.grad is not None and bool((p.grad == 0.5).all()) for stages in built
                    for st in stages for p in st.submod.parameters())
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (result.best.name, untouched), group=group)
    if dist.get_rank(group) != 0:
        return None
    return {"names": [r.name for r in result.rows], "best": result.best.name,
            "measured": [r.measured_ms for r in result.rows],
            "predicted": [r.predicted_ms for r in result.rows], "table": result.table(),
            "same_on_every_rank": len({b for b, _ in every}) == 1,
            "grads_untouched": all(u for _, u in every)}


def case_no_target(case, group):
    """The last rank forgets target=: every rank must refuse the first step at once."""
    tt = pwt.load(case["timetable"])
    stages = pwt.pipeline_stages(tt, lambda s: stage_module(s), group=group)
    sched = pwt.schedule(tt, stages, loss_fn=loss_fn)
    x, _ = batch(tt.microbatches)
    try:
        sched.step(x) if dist.get_rank(group) == 0 else sched.step()
        mine = None
    except pwt.BatchError as e:
        mine = str(e)
    every: list = [None] * tt.num_ranks
    dist.all_gather_object(every, mine, group=group)
    return {"refusals": every} if dist.get_rank(group) == 0 else None


def case_dp_record(case, group):
    """Two pipelines of 2 ranks (data parallel) record and save to one path, then to
    `{replica}` paths: the second writer of one path is refused, the others write."""
    rank = dist.get_rank()
    pipes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pipes[rank // 2]
    tt = pwt.load(case["timetable"])
    stages = pwt.pipeline_stages(tt, lambda s: stage_module(s), group=mine)
    rec = pwt.Recorder(pwt.schedule(tt, stages, loss_fn=loss_fn))
    x, y = batch(tt.microbatches)
    for _ in range(2):
        rec.step(x, target=y)
    out = Path(case["out_dir"])
    try:
        rec.save_costs(out / "costs.json")
        shared = None
    except pwt.RecordError as e:
        shared = str(e)
    rec.save_costs(out / "costs.{replica}.json")
    every: list = [None] * 4
    dist.all_gather_object(every, shared)
    return {"refusals": every} if rank == 0 else None


def case_titan(case, group):
    import titan_cases  # torchtitan's own path: imported only where a case asks for it

    return titan_cases.case_titan(case, group)


def case_titan_chunked(case, group):
    import titan_cases

    return titan_cases.case_titan_chunked(case, group)


CASES = {"dp_record": case_dp_record, "grads": case_grads, "record": case_record, "record_torch": case_record_torch,
         "tune": case_tune, "no_target": case_no_target, "titan": case_titan,
         "titan_chunked": case_titan_chunked}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=spec.get("pg_timeout", 60)),
    )
    sizes = sorted({c["p"] for c in spec["cases"]})
    groups = {p: dist.new_group(list(range(p))) for p in sizes}
    results = []
    for case in spec["cases"]:
        result = None
        if rank < case["p"]:
            try:
                result = CASES[case["kind"]](case, groups[case["p"]])
            except Exception as e:  # reported per case; the run stops (peers may be stuck)
                msg = f"{type(e).__name__}: {e}".splitlines()[0]
                print(f"rank {rank}, case {case.get('name')}: {msg}", file=sys.stderr)
                traceback.print_exc()
                if rank == 0:
                    results.append({"name": case.get("name"), "error": msg})
                    Path(spec["out"]).write_text(json.dumps(results))
                os._exit(3)
        dist.barrier()
        if rank == 0:
            results.append({"name": case.get("name"), **(result or {})})
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps(results))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
