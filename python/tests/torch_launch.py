"""Start one process per rank for `torch_worker.py`, with a timeout, and read its results."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def pipewright_bin() -> str:
    """The `pipewright` CLI: $PIPEWRIGHT_BIN, else the newest build in target/, else built now."""
    given = os.environ.get("PIPEWRIGHT_BIN")
    if given:
        return given
    built = [REPO / "target" / kind / "pipewright" for kind in ("release", "debug")]
    found = [p for p in built if p.exists()]
    if not found:
        subprocess.run(["cargo", "build", "--bin", "pipewright"], cwd=REPO, check=True)
        found = [built[1]]
    return str(max(found, key=lambda p: p.stat().st_mtime))


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the `pipewright` CLI; with `check`, fail the test with its stderr if it fails."""
    done = subprocess.run([pipewright_bin(), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"pipewright {' '.join(map(str, args))} failed:\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    # The ranks import the pipewright this process imported (installed, or a source tree
    # with its native module built in place).
    import pipewright

    here = str(Path(pipewright.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def run_cases(world: int, cases: list[dict], timeout: float = 240.0, **spec) -> dict[str, dict]:
    """Run `cases` on `world` processes; results by case name. Fails loudly on a hang."""
    with tempfile.TemporaryDirectory(prefix="pw-torch-") as tmp:
        out = Path(tmp) / "results.json"
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps({"cases": cases, "out": str(out), **spec}))
        port = free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "torch_worker.py"), str(spec_path)],
                env=env_for(r, world, port),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for r in range(world)
        ]
        logs, timed_out = [], False
        for p in procs:
            try:
                logs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                timed_out = True
                for q in procs:
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                logs.append(p.communicate()[0])
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        results = json.loads(out.read_text()) if out.exists() else []
        log = "\n".join(f"--- rank {r} ---\n{text[-4000:]}" for r, text in enumerate(logs))
        if timed_out:
            raise AssertionError(f"the run passed {timeout} s and was stopped\n{log}")
        bad = [r for r in results if "error" in r]
        codes = [p.returncode for p in procs]
        if bad or any(codes):
            raise AssertionError(f"failed cases {bad}, exit codes {codes}\n{log}")
        return {r["name"]: r for r in results}
