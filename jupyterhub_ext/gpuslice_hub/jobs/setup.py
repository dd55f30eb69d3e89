"""Wiring the job scheduler into the service (kept out of app.py: one line there)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .backends import LocalBackend
from .backends.slurm import SlurmBackend
from .manager import JobManager
from .scheduler import Scheduler

if TYPE_CHECKING:
    from ..app import GPUSliceService


def start_jobs(app: GPUSliceService) -> JobManager:
    assert app.ledger is not None and app.db is not None
    if app.job_backend == "kubernetes":
        raise ConfigError(
            "job_backend", "kubernetes jobs are built as manifests only; use local or slurm"
        )
    manager = JobManager(
        app.ledger, app.db, LocalBackend(), Path(app.jobs_root).resolve(), parent=app
    )
    python = manager.runner_python or sys.executable
    if app.job_backend == "slurm":
        manager.backend = SlurmBackend(
            python, partitions=manager.slurm_partitions, gres_by_profile=manager.slurm_gres
        )
    elif manager.runner_python:
        manager.backend = LocalBackend(manager.runner_python)
    app.ledger.preempt_hook = manager.preempt_for_interactive
    scheduler = Scheduler(manager, simulated=bool(app.inventory and app.inventory.simulated))
    manager.task = asyncio.ensure_future(scheduler.run_forever())
    return manager
