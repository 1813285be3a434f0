#!/usr/bin/env python3
"""pipewright.torch's recorder, measured: what it adds to a step, and how well the simulator
predicts a recorded PyTorch step from the costs recorded in it.

    python python/benches/torch_recorder.py overhead [--pairs 40]
    python python/benches/torch_recorder.py stamps
    python python/benches/torch_recorder.py predict [--stage sleep|linear|transformer] [--steps 7]

One process per rank (gloo on the CPU), started by this script. Needs the `pipewright` CLI
(`$PIPEWRIGHT_BIN`, else target/release/pipewright) and `pipewright.torch`: installed, or
built in place in python/ (the script puts python/ on the path when no other is importable).

overhead: 1F1B, p = 2, m = 8, each stage sleeping 1 ms in its forward and 1 ms in its
    backward (actions of 1 ms that leave the CPU free). Plain steps, recorded steps and
    recorded steps with `fence=True` take turns in a new random order each round, each
    between two barriers; the ratios of the medians are the recorder's cost.
stamps: the recorder's own work per action in one process (the row it walks, a wrapped
    compute call), recording against not recording.
predict: for each timetable, `--steps` recorded steps (fenced: each starts after a barrier, as
    the simulator's one step does) after two warm-up steps; the costs are
    the recorded steps' medians (`Recorder.save_costs`), `pipewright simulate` predicts one
    step from them, and the measured step is the median makespan of the recorded timelines.
    The gap is split, on the rank that finishes last, into its compute beyond the simulated
    busy time (medians against every action), its waits for data beyond the simulated idle
    time, posting sends, and the rest: PyTorch's own actions (WAIT_SEND, REDUCE_GRAD,
    UNSHARD, ...) and its Python between actions. The cost file carries the measured hand-off
    latency (`p2p_latency`: from a producer's compute end to a waiting consumer's compute
    start, median); the compute-only prediction sets it to 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("pipewright") is None:  # not installed: the one built in place
    sys.path.insert(0, str(REPO / "python"))


def pipewright_bin() -> str:
    return os.environ.get("PIPEWRIGHT_BIN") or str(REPO / "target" / "release" / "pipewright")


def cli(*args) -> str:
    done = subprocess.run([pipewright_bin(), *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pipewright {' '.join(map(str, args))}: {done.stderr.strip()}")
    return done.stdout


# ---------------------------------------------------------------- the workers (one per rank)


def worker(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import pipewright.torch as pwt

    torch.set_num_threads(1)
    width = spec.get("width", 16)

    vocab, seq = 256, 32

    class Block(torch.nn.Module):
        """A pre-norm causal self-attention block and a GELU MLP (TinyGPT's)."""

        def __init__(self):
            super().__init__()
            self.n1, self.n2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.attn = torch.nn.MultiheadAttention(width, 4, batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(x.size(1))
            h = self.n1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.n2(x))

    def transformer(stage: int, stages: int, v: int):
        parts = [torch.nn.Embedding(vocab, width)] if stage == 0 else []
        parts += [Block() for _ in range(spec["layers"] // v)]
        if stage == stages - 1:
            parts += [torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab)]
        return torch.nn.Sequential(*parts)

    def module(stage: int, v: int, stages: int = 0):
        # One model whatever the cut: a rank's share is the same with v chunks a rank (each
        # chunk sleeps 1/v of the time, or holds 1/v of the layers), so that costs recorded
        # with one chunk count predict another.
        torch.manual_seed(stage)
        if spec["stage"] == "transformer":
            return transformer(stage, stages, v)
        if spec["stage"] == "sleep":
            sleep = pwt.Sleep(spec["f_ms"] / v, spec["b_ms"] / v)
            return torch.nn.Sequential(torch.nn.Linear(width, width), sleep)
        if spec["layers"] % v:
            raise SystemExit(f"--layers {spec['layers']} does not split into {v} chunks")
        return torch.nn.Sequential(*[m for _ in range(spec["layers"] // v) for m in
                                     (torch.nn.Linear(width, width), torch.nn.Tanh())])

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=120))
    results = []
    for job in spec["jobs"]:
        tt = pwt.load(job["timetable"])
        v = tt.num_stages // tt.num_ranks
        stages = pwt.pipeline_stages(tt, lambda s: module(s, v, tt.num_stages))
        rows = tt.microbatches * spec.get("mb", 4)
        if spec["stage"] == "transformer":
            g = torch.Generator().manual_seed(0)
            x = torch.randint(0, vocab, (rows, seq), generator=g)
            y = torch.roll(x, -1, dims=1)
            loss = lambda out, t: torch.nn.functional.cross_entropy(out.reshape(-1, vocab),
                                                                    t.reshape(-1))
        else:
            x = torch.randn(rows, width)
            y = torch.randn_like(x)
            loss = torch.nn.functional.mse_loss
        sched = pwt.schedule(tt, stages, loss_fn=loss)
        rec = pwt.Recorder(sched, fence=job["kind"] == "predict")  # predict: one step on its own
        for _ in range(2):
            sched.step(x, target=y)
        if job["kind"] == "overhead":
            # The same schedule three ways, in turn: plain, recorded (the default), and
            # recorded with fence=True (a barrier before each step).
            fenced = pwt.Recorder(sched, fence=True)
            runs = {"plain": sched.step, "recorded": rec.step, "fenced": fenced.step}
            times: dict = {k: [] for k in runs}
            order = list(runs)
            for k in range(job["pairs"]):
                random.Random(k).shuffle(order)  # the same order on every rank, new each round
                for name in order:
                    run = runs[name]
                    dist.barrier()
                    t0 = time.perf_counter()
                    run(x, target=y)
                    dist.barrier()
                    times[name].append((time.perf_counter() - t0) * 1e3)
            results.append({"name": job["name"], **times})
        else:
            for _ in range(job["steps"]):
                rec.step(x, target=y)
            if job.get("probe"):
                rec.probe_split(x, target=y)
            out = Path(job["out"])
            rec.save_costs(out / "costs.json", skip=0)
            tls = rec.timelines()
            extra = rec.breakdown()
            if tls is not None:
                steps = [json.loads(t.to_json()) for t in tls]
                (out / "steps.json").write_text(json.dumps({"timelines": steps, "breakdown": extra}))
        dist.barrier()
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps(results))
    dist.destroy_process_group()


def launch(world: int, spec: dict) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(spec, out=str(Path(tmp) / "out.json"))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(spec_path)], env=env))
        codes = [p.wait(timeout=900) for p in procs]
        if any(codes):
            raise SystemExit(f"workers failed: exit codes {codes}")
        return json.loads(Path(spec["out"]).read_text())


# ---------------------------------------------------------------- the analysis


def overhead(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "1f1b.csv"
        cli("schedule", "--schedule", "1f1b", "-p", 2, "-m", 8, "-o", csv)
        spec = {"stage": "sleep", "f_ms": 1.0, "b_ms": 1.0,
                "jobs": [{"kind": "overhead", "name": "1f1b", "timetable": str(csv), "pairs": args.pairs}]}
        (r,) = launch(2, spec)
    plain = statistics.median(r["plain"])
    print(f"1F1B p=2 m=8, 1 ms actions, {args.pairs} rounds: plain step {plain:.3f} ms (median)")
    for name in ("recorded", "fenced"):
        t = statistics.median(r[name])
        print(f"  {name}: {t:.3f} ms, ratio {t / plain:.4f} ({(t / plain - 1) * 100:+.2f}%)")


def stamps(args) -> None:
    """The recorder's own work per action, in one process: the row it walks and a wrapped
    stage method, recording or not (the end-to-end ratio is too noisy to see it)."""
    from pipewright.torch._record import _CpuClock, _Probe, _Take, _TimedRow, _timed

    probe, clock, n = _Probe(), _CpuClock(), 200
    row = list(range(n))
    compute = _timed(lambda i: i, probe)

    def walk(record: bool) -> float:
        timed = _TimedRow(row, probe)
        if record:
            probe.take, probe.stamp = _Take(row=row, ref=0), clock.stamp
        t = time.perf_counter()
        for _, action in enumerate(timed):
            compute(action)
        t = time.perf_counter() - t
        probe.take = None
        return t / n * 1e6

    for _ in range(50):
        walk(False), walk(True)
    plain = statistics.median(walk(False) for _ in range(args.rounds))
    recorded = statistics.median(walk(True) for _ in range(args.rounds))
    print(f"per action, one process: walking the row and one compute call {plain:.2f} us, "
          f"recorded {recorded:.2f} us: the recorder adds {recorded - plain:.2f} us an action "
          f"({(recorded - plain) / 10:.3f}% of a 1 ms action)")


def split_gap(tl: dict, p: int, measured: float, sim: dict) -> dict:
    """The gap (measured - simulated), on the rank that finishes last: its compute beyond the
    simulated busy time, its waits for data beyond the simulated idle time, posting sends,
    and the rest (PyTorch's own actions and its Python between actions)."""
    end = {d: max(e["end"] for e in tl["events"] if e["device"] == d) for d in range(p)}
    last = max(end, key=end.get)
    mine = [e for e in tl["events"] if e["device"] == last]
    kind = lambda e: e["action"]["kind"] if isinstance(e["action"]["kind"], str) else "OVERLAP"
    total = lambda kinds: sum(e["end"] - e["start"] for e in mine if kind(e) in kinds)
    compute = total(("F", "B", "I", "W", "OVERLAP"))
    waits = total(("RECV_F", "RECV_B"))
    sends = total(("SEND_F", "SEND_B"))
    busy = sim["devices"][last]["busy"]
    return {"rank": last, "compute": compute - busy, "waits": waits - (sim["makespan"] - busy),
            "sends": sends, "other": measured - compute - waits - sends}


def spearman(a: list, b: list) -> float:
    """Spearman's rank correlation of two equally long lists (no ties expected)."""
    rank = lambda v: {i: r for r, i in enumerate(sorted(range(len(v)), key=v.__getitem__))}
    ra, rb = rank(a), rank(b)
    n = len(a)
    return 1 - 6 * sum((ra[i] - rb[i]) ** 2 for i in range(n)) / (n * (n * n - 1))


def predict(args) -> None:
    p, m = args.p or (4 if args.stage == "sleep" else 2), args.m
    families = [("1f1b", p, 1, m), ("interleaved-1f1b", p, 2, m), ("zb-h1", p, 1, m),
                ("zbv", p, 2, m), ("dualpipev", p, 2, m)]
    families = [f for f in families if not args.only or f[0] in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        jobs = []
        for family, p, v, m in families:
            out = root / family
            out.mkdir(parents=True, exist_ok=True)
            cli("schedule", "--schedule", family, "-p", p, "-v", v, "-m", m, "-o", out / "t.csv")
            jobs.append({"kind": "predict", "name": family, "timetable": str(out / "t.csv"),
                         "steps": args.steps, "out": str(out), "p": p,
                         "probe": family == "1f1b"})
        world = max(j["p"] for j in jobs)
        spec = {"stage": args.stage, "f_ms": 2.0, "b_ms": 4.0, "layers": args.layers,
                "width": args.width, "mb": args.mb, "jobs": jobs}
        if args.stage == "sleep":
            spec["width"] = 16
        launch(world, spec)
        print(f"# load average after the runs {os.getloadavg()[0]:.1f}")
        shown = {"sleep": " (F = 2 ms, B = 4 ms)",
                 "linear": f" ({args.layers} x Linear({args.width}) + Tanh, {args.mb} rows a "
                           "microbatch)",
                 "transformer": f" ({args.layers} pre-norm causal attention + GELU MLP blocks "
                                f"of width {args.width} a rank, 4 heads, vocabulary 256, "
                                f"sequence 32, {args.mb} sequences a microbatch, "
                                "cross-entropy)"}
        print(f"stages: {args.stage}" + shown[args.stage])
        base = root / "1f1b" / "costs.json" if any(j["name"] == "1f1b" for j in jobs) else None
        if base:
            print("host time (ms) from 1F1B: " + json.dumps(json.loads(base.read_text())["host"]))
        print("| timetable | measured, median step | simulated, compute only | error | hand-off "
              "latency (samples) | simulated from its own cost file | error | from 1F1B's + "
              "probe | error | gap on the last rank: compute, waits, sends, between actions |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        ranked = []
        for job in jobs:
            out = Path(job["out"])
            tls = json.loads((out / "steps.json").read_text())["timelines"]
            costs = json.loads((out / "costs.json").read_text())
            spans = sorted(max(e["end"] for e in tl["events"]) for tl in tls)
            mid = sorted(tls, key=lambda tl: max(e["end"] for e in tl["events"]))[len(tls) // 2]
            measured = max(e["end"] for e in mid["events"])  # the median step
            simulate = lambda *more: json.loads(cli(
                "simulate", "--timetable", out / "t.csv", "--cost-file", out / "costs.json",
                "--format", "json", *more))
            compute_only = simulate("--p2p-latency", 0)["makespan"]
            sim = simulate()  # the cost file as recorded: its p2p_latency included
            lat = costs.get("p2p_latency", 0.0)
            source = costs.get("source", "")
            samples = source.split("p2p_latency: median of ")[1].split(" ")[0] if "p2p_latency" in source else 0
            g = split_gap(mid, job["p"], measured, sim)
            err = lambda s: f"{(s / measured - 1) * 100:+.1f}%"
            cross = json.loads(cli("simulate", "--timetable", out / "t.csv", "--cost-file", base,
                                   "--format", "json"))["makespan"] if base else float("nan")
            ranked.append((measured, cross))
            print(f"| {job['name']} p={job['p']} | {measured:.1f} ms (fastest {spans[0]:.1f}) | "
                  f"{compute_only:.1f} ms | {err(compute_only)} | {lat:.2f} ms ({samples}) | "
                  f"{sim['makespan']:.1f} ms | {err(sim['makespan'])} | {cross:.1f} ms | "
                  f"{err(cross)} | rank {g['rank']}: {g['compute']:+.1f}, {g['waits']:+.1f}, "
                  f"{g['sends']:+.1f}, {g['other']:+.1f} ms |")
        if base and len(ranked) > 2:
            print(f"Spearman rank correlation, measured against predicted from 1F1B + probe: "
                  f"{spearman([a for a, _ in ranked], [b for _, b in ranked]):.2f}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(Path(sys.argv[2]).read_text()))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--pairs", type=int, default=40, help="rounds of the three ways")
    st = sub.add_parser("stamps")
    st.add_argument("--rounds", type=int, default=300)
    pr = sub.add_parser("predict")
    pr.add_argument("--stage", choices=["sleep", "linear", "transformer"], default="sleep")
    pr.add_argument("--steps", type=int, default=7)
    pr.add_argument("--p", type=int, help="pipeline ranks (default 4 with sleep, 2 with linear)")
    pr.add_argument("--m", type=int, default=16, help="microbatches")
    pr.add_argument("--layers", type=int, default=4)
    pr.add_argument("--width", type=int, default=256)
    pr.add_argument("--mb", type=int, default=64)
    pr.add_argument("--only", nargs="*", help="timetables to run (default: all five)")
    pr.add_argument("--keep", help="folder to keep the timetables, steps and cost files in")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"# {platform.node()}: {os.cpu_count()} cores, load average {load:.1f}, "
          f"python {platform.python_version()}")
    {"overhead": overhead, "stamps": stamps, "predict": predict}[args.what](args)


if __name__ == "__main__":
    main()
