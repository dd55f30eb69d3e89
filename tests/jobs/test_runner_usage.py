"""The runner's GPU usage figures in state.json, with real kernels: a simulated slice (CPU
use of the kernel's tree stands in for GPU use) and the fake NVML driver in the runner's
process (the only fake part: the GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from gpuslice.activity.simulated_source import HORIZON
from tests.fakes import FAKE_NVML_ENV
from tests.fakes.fake_pynvml import write_state
from tests.harness.hub import wait_for
from tests.jobs.notebooks import make_job_dir

INTERVAL = 0.5


def start_runner(job_dir: Path, *args: str, **env: str) -> subprocess.Popen:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GPUSLICE_SIMULATED", FAKE_NVML_ENV, "GPUSLICE_USAGE_INTERVAL")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuslice.run", str(job_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**clean, **env},
    )


def state(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def at(s: dict) -> float:
    return datetime.fromisoformat(s["utilization_at"].replace("Z", "+00:00")).timestamp()


def finish(proc: subprocess.Popen, job_dir: Path) -> None:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, (job_dir / "job.log").read_text())


def test_a_busy_cell_reads_busy_and_a_sleeping_cell_idle(tmp_path: Path):
    cells = [
        "import time",
        "end = time.time() + 5\nn = 0\nwhile time.time() < end:\n    n += 1",
        "time.sleep(7)",
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells, interval=3600)
    proc = start_runner(jd, "--usage-interval", str(INTERVAL), GPUSLICE_SIMULATED="1")
    # Watch the state while the job runs. The busy cell is code cell 2 (after the
    # parameters cell), the sleeping one 3; when each was first seen to start is noted.
    seen: dict[int, float] = {}
    readings: list[tuple[int, float, float | None]] = []  # (cell, written at, utilization)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        s = state(jd)
        cell = s.get("current_cell")
        if cell is not None:
            seen.setdefault(cell, time.time())
        if cell is not None and "utilization_at" in s:
            reading = (cell, at(s), s["utilization"])
            if not readings or readings[-1] != reading:
                readings.append(reading)
        time.sleep(0.05)  # polling the file the runner writes, not waiting for an event
    finish(proc, jd)
    assert 1 in seen and 2 in seen, readings

    def settled(cell: int) -> list[float | None]:
        # Readings whose whole window lies inside the cell: written a full interval, the
        # simulated source's horizon and a margin after the cell was seen to start.
        since = seen[cell] + HORIZON + 2 * INTERVAL
        return [u for c, t, u in readings if c == cell and t >= since]

    busy, idle = settled(1), settled(2)
    assert busy and idle, readings
    # not "near 100": the test machine's two cores are shared with other tests' work
    assert max(u or 0.0 for u in busy) > 20, readings
    assert all(u is not None and u < 10 for u in idle), readings
    final = state(jd)
    assert final["status"] == "completed" and final["memory_mib"] == 0.0  # no fake memory
    assert final["utilization_at"].endswith("Z")


def test_no_figures_with_the_interval_zero(tmp_path: Path):
    jd = make_job_dir(tmp_path / "job", cells=["import time\ntime.sleep(1)"])
    finish(start_runner(jd, "--usage-interval", "0", GPUSLICE_SIMULATED="1"), jd)
    assert not {"utilization", "memory_mib", "utilization_at"} & set(state(jd))


def test_nvml_figures_and_an_unreadable_gpu_reads_null_once(tmp_path: Path):
    nvml = tmp_path / "nvml.json"
    write_state(nvml, {"driver": "driver_not_loaded"})
    # the cell runs until the test lets it finish
    cells = ["import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)"]
    jd = make_job_dir(tmp_path / "job", cells=cells, interval=3600)
    env = {FAKE_NVML_ENV: str(nvml), "CUDA_VISIBLE_DEVICES": "GPU-0"}
    proc = start_runner(jd, "--usage-interval", str(INTERVAL), **env)
    try:
        writes: set[str] = set()

        def unreadable_a_while() -> bool:
            s = state(jd)
            if "utilization_at" in s:
                assert s["utilization"] is None and s["memory_mib"] is None, s
                writes.add(s["utilization_at"])
            return len(writes) >= 3

        wait_for(unreadable_a_while, 60, "three null readings")
        log = (jd / "job.log").read_text()
        assert log.count("GPU utilization could not be read (nvml)") == 1, log

        pid = state(jd)["kernel_pid"]
        device = {"uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}
        others = [{"pid": os.getpid(), "used_memory_mib": 999, "sm_util": 90}]  # not the job's
        device["processes"] = [{"pid": pid, "used_memory_mib": 2048, "sm_util": 40}, *others]
        write_state(nvml, {"driver": "ok", "devices": [device]})
        wait_for(
            lambda: (state(jd).get("utilization"), state(jd).get("memory_mib")) == (40.0, 2048.0),
            60,
            "the kernel's NVML figures",
        )
        assert "GPU utilization can be read again" in (jd / "job.log").read_text()
    finally:
        (jd / "go").touch()
    finish(proc, jd)
