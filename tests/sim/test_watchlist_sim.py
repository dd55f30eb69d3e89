"""A pass that looks only at the jobs the simulator's backend names as changed
(jobs/watchlist.py) looks at exactly the jobs the pass over every running job would have
looked at: the same workload gives the same looks, pass for pass, and the same result."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks.sim.backend import SimBackend
from benchmarks.sim.engine import Settings, Simulation
from benchmarks.sim.policies import POLICIES
from benchmarks.sim.workload import BatchJob, Session, Stretch, Workload
from gpuslice_hub.jobs.scheduler import Scheduler

HOURS = 3600.0


def workload(seed: int) -> Workload:
    """A day of one host: short and long preemptible jobs of shares and whole GPUs, some
    past their max runtime, and people whose spawns preempt them."""
    rng = random.Random(seed)
    jobs = [
        BatchJob(
            i,
            f"b{i % 5}",
            "g",
            rng.uniform(0, 20 * HOURS),
            rng.choice(["gpu-1", "share-250", "share-500"]),
            rng.choice([600.0, 1800.0, 4 * HOURS, 12 * HOURS]),
            rng.randrange(100, 900),
            checkpoint_interval=rng.choice([300.0, 600.0]),
        )
        for i in range(60)
    ]
    sessions = [
        Session(
            100 + i,
            f"u{i}",
            "g",
            rng.uniform(0, 22 * HOURS),
            "gpu-1",
            (Stretch(rng.uniform(600, 3 * HOURS), 400), Stretch(rng.uniform(600, 2 * HOURS))),
        )
        for i in range(12)
    ]
    return Workload(1, sessions, jobs)


def simulate(w: Workload, folder: Path, monkeypatch: pytest.MonkeyPatch, follow: bool):
    looks: list[tuple[Any, int]] = []
    asked: list[int] = []
    watch, poll_many = Scheduler._watch, SimBackend.poll_many

    def recorded_watch(self: Scheduler, job: Any, now: Any, status: Any) -> None:
        looks.append((now, job.id))
        watch(self, job, now, status)

    def counted_poll(self: SimBackend, refs: Any) -> Any:
        asked.append(len(refs))
        return poll_many(self, refs)

    with monkeypatch.context() as m:
        m.setattr(Scheduler, "_watch", recorded_watch)
        m.setattr(SimBackend, "poll_many", counted_poll)
        if not follow:
            m.delattr(SimBackend, "changed_jobs")
        folder.mkdir()
        settings = Settings(n_hosts=1, mig_hosts=0)
        result = Simulation(w, POLICIES["4"], settings, seed=5, folder=folder).run()
    return looks, asked, result


@pytest.mark.parametrize("seed", [1, 2])
def test_following_changes_looks_at_what_looking_at_all_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
):
    w = workload(seed)
    all_looks, all_asked, every = simulate(w, tmp_path / "all", monkeypatch, follow=False)
    some_looks, some_asked, followed = simulate(w, tmp_path / "some", monkeypatch, follow=True)
    assert some_looks == all_looks
    assert [j["state"] for j in followed.batch_jobs] == [j["state"] for j in every.batch_jobs]
    assert (followed.batch_useful, followed.losses) == (every.batch_useful, every.losses)
    assert sum(j["preemptions"] for j in every.batch_jobs) > 0  # people preempted jobs
    # not vacuous: the passes asked the backend about far fewer runs
    assert len(some_asked) == len(all_asked) and sum(some_asked) < sum(all_asked) / 2
