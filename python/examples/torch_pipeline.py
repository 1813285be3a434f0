"""Train a model cut into stages with PyTorch's pipelining runtime, on any pipewright timetable.

    pipewright schedule --schedule 1f1b -p 2 -m 8 -o 1f1b.csv
    torchrun --nproc-per-node 2 python/examples/torch_pipeline.py --timetable 1f1b.csv \\
        --costs-out costs.json --timeline step.json
    pipewright search -p 2 -m 8 --cost-file costs.json --memory-cap 2 \\
        --timetable-out best.csv --runners-up 2
    torchrun --nproc-per-node 2 python/examples/torch_pipeline.py --timetable 1f1b.csv \\
        --tune best.csv best.2.csv best.3.csv --cost-file costs.json --tuned-out chosen.csv
    torchrun --nproc-per-node 2 python/examples/torch_pipeline.py --timetable chosen.csv --check

The model is `--layers` blocks of Linear + Tanh (width `--width`), cut into as many stages as
the timetable has (a searched timetable may use more stages than the one measured); the loss
is the mean squared error against a fixed random target. One process per pipeline rank
(`torchrun`), gloo on the CPU or NCCL on GPUs (`--device cuda`).

`--costs-out` and `--timeline` record the last `--steps` steps (after `--warmup` steps) with
`pipewright.torch.Recorder`; with `--costs-out`, a short probe also measures the split backward
(I and W) on the same stages, unless `--no-probe`. `--tune` runs the `--timetable` (the
baseline) and each candidate in turns, `--steps` rounds, prints predicted against measured
(`--cost-file`), and writes the fastest as measured to `--tuned-out`: never slower than the
baseline. `--check` compares the first step's gradients with the same model in one process and
exits non-zero when they differ by more than 1e-6.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import pipewright.torch as pwt


def stage_layers(args, stage: int, stages: int) -> torch.nn.Sequential:
    """Stage `stage`'s share of the blocks, built the same way on every rank and in `--check`."""
    if args.layers % stages:
        raise SystemExit(
            f"error: --layers {args.layers} does not split evenly into the timetable's {stages} stages"
        )
    per = args.layers // stages
    blocks = []
    for layer in range(stage * per, (stage + 1) * per):
        torch.manual_seed(args.seed + layer)
        blocks += [torch.nn.Linear(args.width, args.width, dtype=args.dtype), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks)


def data(args, microbatches: int):
    g = torch.Generator().manual_seed(args.seed)
    n = microbatches * args.microbatch_size
    x = torch.randn(n, args.width, generator=g, dtype=args.dtype)
    y = torch.randn(n, args.width, generator=g, dtype=args.dtype)
    return x, y


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def check(args, tt, stages, grads) -> None:
    """Rank 0: the pipeline's gradients against one process's, on the same data."""
    every: list = [None] * tt.num_ranks
    dist.all_gather_object(every, grads)
    if dist.get_rank() != 0:
        return
    got = {s: g for part in every for s, g in part.items()}
    model = [stage_layers(args, s, tt.num_stages) for s in range(tt.num_stages)]
    x, y = data(args, tt.microbatches)
    m = tt.microbatches
    loss = 0
    for xm, ym in zip(x.chunk(m), y.chunk(m)):
        for part in model:
            xm = part(xm)
        loss = loss + loss_fn(xm, ym) / m
    loss.backward()
    err = max(
        (a - p.grad).abs().max().item()
        for s, part in enumerate(model)
        for a, p in zip(got[s], part.parameters())
    )
    ok = err <= 1e-6
    print(f"gradients against one process: max difference {err:.3g} ({'equal' if ok else 'DIFFERENT'})")
    if not ok:
        sys.exit(1)


def tune(args, baseline, device) -> None:
    """Measure the baseline and the candidates in turns; write the fastest as measured."""

    def build(tt):
        stages = pwt.pipeline_stages(
            tt, lambda s: stage_layers(args, s, tt.num_stages).to(device), device=device
        )
        return pwt.schedule(tt, stages, loss_fn=loss_fn)

    from pipewright.torch._outputs import _same_file, output_path

    read = [("--timetable", args.timetable), *(("--tune", c) for c in args.tune)]
    read += [("--cost-file", args.cost_file)] if args.cost_file else []
    if args.tuned_out:  # refused before the tuning, not after it
        out = output_path(args.tuned_out, "--tuned-out")
        for flag, path in read:
            if _same_file(out, path):
                raise SystemExit(f"error: --tuned-out {out} is the file {flag} {path} reads: "
                                 "writing it would destroy the input; give another file")
    try:
        candidates = [baseline, *(pwt.load(c) for c in args.tune)]
    except pwt.TorchError as e:
        raise SystemExit(f"error: {e}")
    x, y = (t.to(device) for t in data(args, baseline.microbatches))
    result = pwt.tune(candidates, build, x, target=y, steps=args.steps, costs=args.cost_file)
    if dist.get_rank() != 0:
        return
    print(result.table())
    best = result.best
    print(f"fastest as measured: {best.name}, {best.measured_ms:.2f} ms a step "
          f"({best.measured_ms / result.baseline.measured_ms:.3f}x the baseline's)")
    if args.tuned_out:
        from pipewright.torch._outputs import write_output

        try:
            write_output(args.tuned_out, best.timetable.csv_text(), read, "--tuned-out")
        except pwt.TorchError as e:
            raise SystemExit(f"error: {e}")
        print(f"wrote {args.tuned_out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timetable", required=True, help="a pipewright timetable (.csv or .json)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--microbatch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5, help="steps to record (or to train)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the recorded ones")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per rank)")
    ap.add_argument("--float64", action="store_true", help="train in float64 (as --check does)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--costs-out", help="write the measured per-stage costs (for pipewright search)")
    ap.add_argument("--timeline", help="write the last recorded step (for pipewright viz --from)")
    ap.add_argument("--no-probe", action="store_true",
                    help="with --costs-out, do not measure the split backward")
    ap.add_argument("--tune", nargs="+", metavar="CSV",
                    help="candidate timetables to measure beside --timetable (the baseline)")
    ap.add_argument("--cost-file", help="with --tune: the costs to predict each step from")
    ap.add_argument("--tuned-out", help="with --tune: write the fastest timetable, as measured")
    ap.add_argument("--check", action="store_true", help="compare gradients with one process")
    args = ap.parse_args()
    args.dtype = torch.float64 if (args.float64 or args.check) else torch.float32

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        tt = pwt.load(args.timetable)
    except pwt.TorchError as e:
        raise SystemExit(f"error: {e}")
    if args.tune:
        tune(args, tt, device)
        dist.destroy_process_group()
        return
    stages = pwt.pipeline_stages(
        tt, lambda s: stage_layers(args, s, tt.num_stages).to(device), device=device
    )
    sched = pwt.schedule(tt, stages, loss_fn=loss_fn)
    recording = args.costs_out or args.timeline
    rec = pwt.Recorder(sched) if recording else None
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    x, y = (t.to(device) for t in data(args, tt.microbatches))
    last = stages[-1].is_last
    for step in range(args.warmup + args.steps):
        opt.zero_grad(set_to_none=True)
        losses: list = []
        if rec is not None and step >= args.warmup:
            rec.step(x, target=y, losses=losses)
        else:
            sched.step(x, target=y, losses=losses)
        if args.check and step == 0:
            grads = {st.stage_index: [p.grad.cpu() for p in st.submod.parameters()] for st in stages}
            check(args, tt, stages, grads)
        opt.step()
        if last:
            print(f"step {step}: loss {torch.stack(losses).mean().item():.6f}")
    if rec is not None:
        if args.costs_out and not args.no_probe:
            opt.zero_grad(set_to_none=True)
            rec.probe_split(x, target=y)
        if args.timeline:
            rec.save_timeline(args.timeline)
        if args.costs_out:
            rec.save_costs(args.costs_out)
        if dist.get_rank() == 0:
            for path in (args.timeline, args.costs_out):
                if path:
                    print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
