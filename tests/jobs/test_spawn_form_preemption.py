"""The spawn form offers a profile none of which is free when, and only when, a spawn of
it would take a preemptible batch job's slice: the same check as the spawn's
(``JobManager.spawn_preemption`` beside ``preempt_for_interactive``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuslice_hub.errors import Pending, Refused
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger

ANN = Caller("ann", (), "ann")


def backfilled(tmp_path: Path) -> JobManager:
    """One host of 8 GPUs, each held by a preemptible batch job."""
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    manager = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    # as start_jobs does
    ledger.preempt_hook = manager.preempt_for_interactive
    ledger.spawn_preemption = manager.spawn_preemption
    insert_queued(manager.db, tmp_path, [(f"u{i}", "gpu-1", "preemptible") for i in range(8)])
    Scheduler(manager).tick(datetime(2026, 12, 4, 12, tzinfo=UTC))
    assert ledger.profile_capacity()["gpu-1"][0] == 0
    return manager


def offered(manager: JobManager, **kw: Any) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in manager.ledger.availability("ann", (), **kw)}


def test_the_form_offers_what_a_spawn_would_get_and_nothing_else(tmp_path):
    manager = backfilled(tmp_path)
    form = offered(manager)
    # one job's GPU makes room for a whole GPU, or a share of it
    for name in ("gpu-1", "share-250"):
        assert form[name]["free"] == 0 and form[name]["available"], form[name]
        assert form[name]["from_batch"] is True
        assert form[name]["from_batch_seconds"] == manager.preempt_grace
    # no single job's release makes room for two GPUs: all in use, as before
    assert not form["gpu-2"]["available"] and "from_batch" not in form["gpu-2"]
    assert form["gpu-2"]["reason"].startswith("all in use")
    # a spawner that waits less than a job's grace period: not offered, and why
    short = offered(manager, wait_seconds=manager.preempt_grace - 1)["gpu-1"]
    assert not short["available"] and "could give its slice up" in short["reason"]

    # and the spawns agree: the two GPUs are refused, the one preempts a job
    with pytest.raises(Refused) as refused:
        manager.ledger.allocate(ANN, "gpu-2", "two", wait_seconds=3600)
    assert refused.value.code == "no_capacity"
    with pytest.raises(Pending):
        manager.ledger.allocate(ANN, "gpu-1", "", wait_seconds=3600)


class VictimEnds(JobManager):
    """The job a spawn picked ends before the spawn asks it to give its slice up (its owner
    cancels it: another thread, or its own completion)."""

    def _victim_for(self, *args: Any, **kwargs: Any) -> Any:
        victim = super()._victim_for(*args, **kwargs)
        if victim is not None:
            self.cancel(victim.id, victim.user)
        return victim


def test_a_spawn_whose_chosen_job_ends_first_is_asked_to_try_again_not_refused(tmp_path):
    """Found by an attack: the spawn failed with "job 1 is cancelled, not running" (another
    user's job, and the slice was just freed)."""
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    manager = VictimEnds(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    ledger.preempt_hook = manager.preempt_for_interactive
    insert_queued(manager.db, tmp_path, [(f"u{i}", "gpu-1", "preemptible") for i in range(8)])
    Scheduler(manager).tick(datetime(2026, 12, 4, 12, tzinfo=UTC))
    with pytest.raises(Pending) as pending:
        ledger.allocate(ANN, "gpu-1", "", wait_seconds=3600)
    assert pending.value.detail["retry_after"] == 1
    assert "asking for it again" in pending.value.message
    # and the spawn's next try gets the slice the job gave back
    got = ledger.allocate(ANN, "gpu-1", "", wait_seconds=3600)
    assert got[0]["purpose"] == "interactive"
