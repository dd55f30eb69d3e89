"""Preemption cost with the local runner: time from the preemption signal to the job
computing again (checkpoint, exit, new runner, kernel start, namespace restore, first
step), and work lost against the checkpoint interval when the runner is SIGKILLed instead.

Usage: .venv/bin/python benchmarks/checkpoint_preempt.py [--trials 3]

The notebook trains in steps of ~10 ms and records each finished step in ``step.txt``; the
service's scheduler pass (1 s by default) comes on top of the restart figure when the job
goes through the service.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

STEP_SECONDS = 0.01
CELLS = [
    "steps = 100000",
    "import os, time\nimport gpuslice.checkpoint\nckpt = gpuslice.checkpoint.open()\n"
    "state = ckpt.restore()\nfirst = ckpt.step\nw = state['w'] if state else 0.0",
    f"for step in ckpt.steps(steps):\n    time.sleep({STEP_SECONDS!r})\n    w += 1.0\n"
    "    ckpt.save(w=w)\n    open('step.tmp', 'w').write(f'{step} {first}')\n"
    "    os.replace('step.tmp', 'step.txt')",
]


def job_dir(root: Path, interval: float) -> Path:
    d = Path(tempfile.mkdtemp(dir=root))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "P"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nbformat.write(nb, d / "input.ipynb")
    (d / "job.json").write_text(json.dumps({"checkpoint_interval": interval, "parameters": {}}))
    return d


def start(d: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuslice.run", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def read_step(d: Path) -> tuple[int, int] | None:
    try:
        step, first = (d / "step.txt").read_text().split()
        return int(step), int(first)
    except (OSError, ValueError):
        return None


def wait(pred, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.005)
    raise TimeoutError


def resume_latency(root: Path) -> tuple[float, float]:
    """(signal → runner exited, signal → first step of the resumed run)."""
    d = job_dir(root, 600)
    p = start(d)
    wait(lambda: (s := read_step(d)) and s[0] > 50)
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    p.wait()
    t1 = time.monotonic()
    (d / "step.txt").unlink()
    p = start(d)
    wait(lambda: (s := read_step(d)) and s[1] > 0)
    t2 = time.monotonic()
    kill_all(d, p)
    return t1 - t0, t2 - t0


def kill_all(d: Path, p: subprocess.Popen) -> None:
    """SIGKILL the runner and its kernel (in a session of its own), like a lost node."""
    kernel = json.loads((d / "state.json").read_text()).get("kernel_pid")
    os.killpg(p.pid, signal.SIGKILL)
    if kernel:
        os.kill(kernel, signal.SIGKILL)
    p.wait()


def lost_on_kill(root: Path, interval: float) -> float:
    """Seconds of steps redone after a SIGKILL at a random moment."""
    d = job_dir(root, interval)
    p = start(d)
    wait(lambda: (s := read_step(d)) and s[0] > 10)
    time.sleep(random.uniform(0, 2 * interval))
    kill_all(d, p)
    reached = read_step(d)
    assert reached is not None
    (d / "step.txt").unlink()
    p = start(d)
    _, first = wait(lambda: read_step(d))
    kill_all(d, p)
    return (reached[0] + 1 - first) * STEP_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    random.seed(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lat = [resume_latency(root) for _ in range(args.trials)]
        print(
            f"signal → exited: median {statistics.median(a for a, _ in lat):.2f}s; "
            f"signal → computing again: median {statistics.median(b for _, b in lat):.2f}s "
            f"(max {max(b for _, b in lat):.2f}s)"
        )
        print("| checkpoint interval | work lost on SIGKILL: mean | max |")
        print("|---:|---:|---:|")
        for interval in (1.0, 2.0, 5.0):
            lost = [lost_on_kill(root, interval) for _ in range(args.trials)]
            print(f"| {interval:g} s | {statistics.mean(lost):.2f} s | {max(lost):.2f} s |")


if __name__ == "__main__":
    main()
