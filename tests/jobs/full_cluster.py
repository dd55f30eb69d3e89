"""A full cluster with a queue, without a hub: the ledger, the job manager and the scheduler
on one database, and a backend that is never asked to start anything. Shared by the
scheduler-pass tests and ``benchmarks/scheduler_pass.py``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select

from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller, Ledger
from tests.service.conftest import build_ledger

PROFILES: list[dict] = [
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
    {"name": "gpu-2", "kind": "gpu", "count": 2},
]


class IdleBackend:
    """Runs nothing; remembers which jobs it was asked to start."""

    name = "local"

    def __init__(self) -> None:
        self.started: list[int] = []

    def start(self, job_id: int, *a: Any, **kw: Any) -> dict[str, Any]:
        self.started.append(job_id)
        return {"job": job_id}

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return RunStatus(True)

    def poll_many(self, refs: list[dict[str, Any]]) -> list[RunStatus]:
        return [self.poll(ref) for ref in refs]

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        pass

    def kill(self, ref: dict[str, Any]) -> None:
        pass


def hosts(n: int) -> list[dict]:
    gpu = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 8}
    return [
        {"name": f"n{i:03d}", "cpu_milli": 128000, "memory_mib": 1024000, "gpus": [gpu]}
        for i in range(n)
    ]


def full_cluster(
    folder: Path, n_hosts: int, policy: str = "best-fit", quotas: dict | None = None
) -> tuple[Ledger, Scheduler]:
    """``n_hosts`` x 8 GPUs, each held by an interactive server."""
    ledger = build_ledger(
        f"sqlite:///{folder}/ledger.sqlite",
        profiles=PROFILES,
        quotas=quotas,
        hosts=hosts(n_hosts),
        policy=policy,
    )
    for i in range(n_hosts * 8):
        ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "gpu-1", "", learn=False)
    manager = JobManager(ledger, ledger.db, IdleBackend(), folder / "jobs")  # type: ignore[arg-type]
    manager.log.setLevel(logging.WARNING)
    manager.run_jobs_as_service_user = True  # the queue's users have no system accounts
    return ledger, Scheduler(manager)


def insert_queued(
    db: Any, folder: Path, specs: list[tuple[str, str, str]], backend: str = "local"
) -> list[int]:
    """Queued jobs of (user, profile, priority class), as a submission leaves them (each
    with its "queued" transition), in two statements; returns their ids."""
    now = utcnow()
    with db.reading() as s:
        first = int(s.scalar(select(func.max(JobRow.id))) or 0)
    rows = [
        {
            "name": f"job {i}",
            "user": user,
            "groups": [],
            "state": "queued",
            "profile": profile,
            "slices": 1,
            "priority_class": priority,
            "checkpoint_interval": 600.0,
            "max_runtime": 86400.0,
            "parameters": {},
            "notebook_path": "",
            "job_dir": str(folder / f"job-{first + 1 + i}"),
            "backend": backend,
            "backend_ref": {},
            "allocation_ids": [],
            "submitted_at": now,
        }
        for i, (user, profile, priority) in enumerate(specs)
    ]
    ids = list(range(first + 1, first + 1 + len(rows)))
    history = [
        {"job_id": i, "from_state": None, "state": "queued", "at": now, "reason": "submitted"}
        for i in ids
    ]
    with db.writing() as s:
        s.connection().execute(insert(JobRow.__table__), rows)  # type: ignore[arg-type]
        s.connection().execute(insert(JobTransitionRow.__table__), history)  # type: ignore[arg-type]
    return ids


def queue(ledger: Ledger, folder: Path, n: int, priority: str, users: int = 500) -> None:
    """``n`` queued jobs over the profiles in turn; the first is ``normal`` (a blocked
    normal job keeps every later normal one waiting behind it)."""
    specs = [
        (f"r{i % users}", PROFILES[i % len(PROFILES)]["name"], "normal" if i == 0 else priority)
        for i in range(n)
    ]
    insert_queued(ledger.db, folder, specs)
