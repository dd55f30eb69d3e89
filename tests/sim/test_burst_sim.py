"""Burst in the simulator, on one host of 8 GPUs held by people for 4 hours, worked out by
hand: the service's own decision (jobs/burst.py) sends a waiting job to capacity bought
elsewhere, where it runs at once; the report counts the GPU-hours bought and the wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sim.engine import Settings, Simulation
from benchmarks.sim.measure import summary
from benchmarks.sim.policies import POLICIES
from benchmarks.sim.workload import BatchJob, Session, Stretch, Workload

ONE_HOST = Settings(n_hosts=1, mig_hosts=0)
FULL = [Session(i, f"u{i}", "g", 0, "gpu-1", (Stretch(14400, 500),)) for i in range(8)]
# an hour of work on one GPU, arriving at 600 s while every GPU is held
JOB = BatchJob(0, "b0", "g", 600, "gpu-1", 3600, 800, 1, 600.0)


def run(burst: str, tmp_path: Path):
    policy = POLICIES["4"].vary("burst", burst) if burst else POLICIES["4"]
    folder = tmp_path / (burst or "off")
    folder.mkdir()
    w = Workload(0.5, FULL, [JOB])
    return Simulation(w, policy, ONE_HOST, seed=3, folder=folder).run()


def test_a_job_that_waited_half_its_run_time_runs_on_bought_capacity(tmp_path: Path):
    # waited 0.5 x 3 600 s at 2 400 s (checks every 60 s): sent, done at 6 000 s
    on = run("0.5", tmp_path)
    assert on.bursts == {1: (2400.0, 6000.0, 3600.0)}
    s = summary(on)
    assert s["jobs_burst"] == 1 and s["burst_gpu_hours"] == pytest.approx(1.0)
    assert s["queue_p50_h"] == pytest.approx(1800 / 3600)
    assert s["completion_p50_h"] == pytest.approx(5400 / 3600)
    assert on.batch_useful == 0  # its work is not this cluster's
    # without it, the job starts when the people stop at 4 hours
    off = summary(run("", tmp_path))
    assert off["jobs_burst"] == 0 and off["burst_gpu_hours"] == 0
    assert off["queue_p50_h"] == pytest.approx((14400 - 600) / 3600)


def test_a_full_cluster_sends_a_job_that_waited_five_minutes(tmp_path: Path):
    # allocated 100 % > 50 % from the first check (0 s): high from 600 s on; the job,
    # queued at 600 s, has waited 5 minutes at 900 s
    on = run("5@0.5", tmp_path)
    assert on.bursts == {1: (900.0, 4500.0, 3600.0)}


@pytest.mark.parametrize("value", ["0", "11", "0.5@1", "soon"])
def test_bad_burst_values_are_refused(value: str):
    with pytest.raises(ValueError, match="burst must be"):
        POLICIES["4"].vary("burst", value)
