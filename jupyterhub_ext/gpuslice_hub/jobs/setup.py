"""Wiring the job scheduler into the service (kept out of app.py: one line there), and the
start-up checks that keep users' jobs under their owners' accounts."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuslice_spawner.kubernetes_resources import KubernetesResourcesConfig
from gpuslice_spawner.launchers.slurm import SlurmGres
from gpuslice_spawner.slurm_gres import SlurmGresConfig

from ..db.models import utcnow
from ..errors import ConfigError
from ..kubecluster import KubernetesClusterConfig
from ..metrics import pass_histogram
from ..profiles import Profile
from .accounts import Account, forbidden_names
from .backends import LocalBackend
from .backends.kubernetes import LABEL_VALUE
from .backends.slurm import NAME as SLURM_NAME
from .backends.slurm import SlurmBackend, check_class_options
from .folders import SWEEP_EVERY
from .manager import JobManager
from .scheduler import Scheduler
from .states import PRIORITY_CLASSES

if TYPE_CHECKING:
    from ..app import GPUSliceService

AS_SERVICE = "JobManager.run_jobs_as_service_user"


def start_jobs(app: GPUSliceService) -> JobManager:
    assert app.ledger is not None and app.db is not None
    manager = JobManager(
        app.ledger, app.db, LocalBackend(), Path(app.jobs_root).resolve(), parent=app
    )
    check_job_settings(app, manager)
    if manager.pools is not None:
        _hosts, gpus, _active = app.ledger.snapshot()
        manager.pools.check_inventory((g.host, g.uuid) for g in gpus if g.present)
    python = manager.python
    if app.job_backend == "slurm":
        options = {
            "qos": manager.slurm_qos,
            "account": manager.slurm_accounts,
            "reservation": manager.slurm_reservations,
            "constraint": manager.slurm_constraints,
        }
        check_class_options(options, list(PRIORITY_CLASSES))
        manager.backend = SlurmBackend(
            python,
            partitions=manager.slurm_partitions,
            qos=manager.slurm_qos,
            # the same gres names, and translation, as the servers' (GPUSliceSlurmSpawner)
            gres=SlurmGresConfig(parent=app).value(),
            submit_prefix=manager.slurm_submit_prefix or None,
            accounts=manager.slurm_accounts,
            reservations=manager.slurm_reservations,
            constraints=manager.slurm_constraints,
        )
        for problem in slurm_model_gaps(app.ledger.profiles, manager.backend.gres):
            app.log.warning("%s", problem)
    elif app.job_backend == "kubernetes":
        manager.backend = kubernetes_backend(app, manager)
    elif manager.runner_python:
        manager.backend = LocalBackend(python)
    app.ledger.preempt_hook = manager.preempt_for_interactive
    app.ledger.spawn_preemption = manager.spawn_preemption
    scheduler = Scheduler(manager, simulated=bool(app.inventory and app.inventory.simulated))
    scheduler.pass_seconds = pass_histogram(app.registry)
    manager.task = asyncio.ensure_future(scheduler.run_forever())
    # job folders of ended jobs go when due, the history retention's included (folders.py)
    manager.sweeper = asyncio.ensure_future(sweep_forever(manager, app.history_retention_days))
    return manager


async def sweep_forever(manager: JobManager, history_days: float) -> None:
    """Sweep the job folders at start, then every ``SWEEP_EVERY`` seconds, in a thread (it
    removes and walks folders); a failure is logged and tried again at the next sweep."""
    while True:
        try:
            swept = await asyncio.to_thread(manager.sweep_folders, utcnow(), history_days)
            if swept.removed or swept.failed:
                manager.log.info(
                    "job folders: %d removed, %d could not be (tried again later)",
                    swept.removed,
                    swept.failed,
                )
        except Exception:
            manager.log.exception("sweeping the job folders failed; trying again later")
        await asyncio.sleep(SWEEP_EVERY)


def slurm_model_gaps(profiles: Mapping[str, Profile], gres: SlurmGres) -> list[str]:
    """Profiles whose GPU models a Slurm batch job cannot ask for: their jobs ask for shards
    or untyped GPUs, and Slurm may run them on any model (the ledger then cannot record
    them there, and the mirror of Slurm's holdings holds the GPU instead)."""
    gaps = []
    types = set(gres.gpu_types.values())
    for profile in profiles.values():
        if profile.kind == "gpu" and not profile.models and len(types) > 1:
            # (with one type its jobs ask for that type: see gres_counts)
            gaps.append(
                f"profile {profile.name}: its batch jobs ask Slurm for an untyped GPU (the "
                f"profile names no model, and {len(types)} GPU types are configured), which "
                "Slurm may satisfy with a MIG instance's gres or any model: give the profile "
                "one model in 'models'"
            )
            continue
        if not profile.models or profile.kind == "mig":
            continue
        typed = profile.kind == "gpu" and len(profile.models) == 1
        if not (typed and profile.models[0] in gres.gpu_types):
            gaps.append(
                f"profile {profile.name}: its batch jobs cannot ask Slurm for "
                f"{', '.join(profile.models)} only (a {profile.kind} gres has no model"
                + ("" if profile.kind == "share" else " unless one model maps to a gres type")
                + "): Slurm may run them on other GPUs"
            )
    return gaps


def kubernetes_backend(app: GPUSliceService, manager: JobManager) -> Any:
    """Jobs through the Kubernetes API, with the servers' resource names."""
    for key in ("kubernetes_image", "kubernetes_jobs_claim"):
        if not getattr(manager, key):
            raise ConfigError(f"JobManager.{key}", "is required with job_backend = 'kubernetes'")
    try:
        from ..kubeapi import api_configuration
        from .backends.kubernetes_client import KubernetesBackend

        configuration = api_configuration(
            KubernetesClusterConfig(parent=app).api_url, needed_by="job_backend"
        )
    except ConfigError:
        raise
    except Exception as e:  # no kubernetes_asyncio
        raise ConfigError("job_backend", f"the Kubernetes API cannot be reached: {e}") from None
    backend = KubernetesBackend(
        configuration,
        manager.kubernetes_namespace,
        manager.kubernetes_image,
        manager.kubernetes_jobs_claim,
        KubernetesResourcesConfig(parent=app).value(),
        grace_seconds=round(manager.preempt_grace),
        kueue_queues=manager.kubernetes_kueue_queues,
        # a pass reads the Jobs and pods from a watch, not two lists of the whole queue
        watch=True,
    )
    try:
        missing = backend.missing_priority_classes()
    except Exception as e:  # not allowed to list them, say: the Jobs will tell
        app.log.warning("the Kubernetes PriorityClasses could not be checked: %s", e)
        missing = []
    if missing:
        # every Job would be created and none of its pods: jobs would wait without a word
        raise ConfigError(
            "job_backend",
            f"the cluster has no PriorityClass {', '.join(missing)}: create them "
            "(gpuslice_hub.jobs.backends.kubernetes.priority_classes() gives the manifests)",
        )
    return backend


def check_job_settings(app: GPUSliceService, manager: JobManager) -> None:
    """Refuse to start a backend that would run users' jobs with the service's rights, or
    hand them the service's variables; warn loudly when an admin chose to."""
    for name, value in manager.job_environment.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name or "=" in name:
            raise ConfigError(
                "JobManager.job_environment", f"{name!r}: names and values must be strings"
            )
    configured = manager.config.get("JobManager", {})
    for key in sorted(configured):
        # settings that would do nothing: another backend's
        engine = next((b for b in ("slurm", "kubernetes") if key.startswith(b + "_")), None)
        if engine is not None and app.job_backend != engine:
            raise ConfigError(
                f"JobManager.{key}",
                f"is for job_backend = {engine!r}; with job_backend = {app.job_backend!r} "
                "it does nothing",
            )
    if "time_window_timezone" in configured and not manager.windows:
        raise ConfigError("JobManager.time_window_timezone", "does nothing without time_windows")
    if app.job_backend in ("slurm", "kubernetes") and "aging_seconds" in configured:
        # a setting that would do nothing: the engine's own priority orders the jobs
        raise ConfigError(
            "JobManager.aging_seconds",
            f"has no effect with job_backend = {app.job_backend!r}: "
            + (
                "Slurm queues the jobs, and its priority (PriorityWeightAge) ages them"
                if app.job_backend == "slurm"
                else "the cluster queues the jobs (its scheduler, or Kueue's queues)"
            ),
        )
    if manager.burst_partition:
        if not SLURM_NAME.fullmatch(manager.burst_partition):
            raise ConfigError(
                "JobManager.burst_partition",
                f"{manager.burst_partition!r} is not one Slurm partition name",
            )
        if app.job_backend != "slurm":
            raise ConfigError(
                "JobManager.burst_partition",
                f"moves waiting Slurm jobs to a second partition (job_backend = 'slurm'), "
                f"not {app.job_backend!r} jobs",
            )
        homes = {cls: manager.slurm_partitions.get(cls, "") for cls in PRIORITY_CLASSES}
        unnamed = sorted(cls for cls, p in homes.items() if not p)
        if unnamed:
            raise ConfigError(
                "JobManager.slurm_partitions",
                f"must name the partition of {', '.join(unnamed)} jobs with burst_partition "
                "set: a job preempted in the burst partition comes back to it",
            )
        if manager.burst_partition in homes.values():
            raise ConfigError(
                "JobManager.burst_partition",
                f"{manager.burst_partition!r} is a class's own partition (slurm_partitions)",
            )
    elif any(k in configured for k in ("burst_after_wait", "burst_when_allocated_above")):
        raise ConfigError(
            "JobManager.burst_after_wait"
            if "burst_after_wait" in configured
            else "JobManager.burst_when_allocated_above",
            "does nothing without burst_partition",
        )
    if app.job_backend in ("slurm", "kubernetes") and manager.windows:
        # a setting that would do nothing: gpuslice's own scheduler enforces the windows
        raise ConfigError(
            "JobManager.time_windows",
            f"are enforced by gpuslice's own queue (job_backend = 'local'); with "
            f"job_backend = {app.job_backend!r} the "
            + ("Slurm" if app.job_backend == "slurm" else "cluster")
            + " queues the jobs (use a reservation, or a partition or queue limited in time)",
        )
    if app.job_backend in ("slurm", "kubernetes") and manager.defragment_moves_per_hour:
        raise ConfigError(
            "JobManager.defragment_moves_per_hour",
            f"moves jobs placed by gpuslice's own scheduler (job_backend = 'local'); with "
            f"job_backend = {app.job_backend!r} the engine places the jobs",
        )
    if app.job_backend in ("slurm", "kubernetes") and manager.pools is not None:
        raise ConfigError(
            "JobManager.reserved_pools",
            f"are enforced by gpuslice's own placement (job_backend = 'local'); with "
            f"job_backend = {app.job_backend!r} the "
            + (
                "Slurm partitions split the nodes (a preemptible partition over the "
                "interactive nodes borrows them)"
                if app.job_backend == "slurm"
                else "cluster places the pods (node pools, taints and priority classes)"
            ),
        )
    if "kubernetes_api_url" in configured:
        raise ConfigError(
            "JobManager.kubernetes_api_url", "has moved: set c.KubernetesClusterConfig.api_url"
        )
    queues = manager.kubernetes_kueue_queues
    if queues and app.job_backend != "kubernetes":
        raise ConfigError(
            "JobManager.kubernetes_kueue_queues", "is for job_backend = 'kubernetes' only"
        )
    unknown = sorted(set(queues) - set(PRIORITY_CLASSES))
    bad = [q for q in queues.values() if not isinstance(q, str) or not LABEL_VALUE.fullmatch(q)]
    if unknown or bad:
        raise ConfigError(
            "JobManager.kubernetes_kueue_queues",
            f"priority classes are {', '.join(PRIORITY_CLASSES)} (got {', '.join(unknown)})"
            if unknown
            else f"{bad[0]!r} is not a LocalQueue name (a label value)",
        )
    for key in ("job_env_keep", "job_environment"):
        bad = forbidden_names(getattr(manager, key))
        if bad:
            raise ConfigError(
                f"JobManager.{key}", f"{bad[0]} would hand a hub or service credential to jobs"
            )
    if manager.run_jobs_as_service_user:
        app.log.warning(
            "%s is on: every user's batch job runs as the service's account (%s), with its "
            "rights to the ledger and job folders. Only for a single-user or demo hub.",
            AS_SERVICE,
            Account.current().name,
        )
        return
    if app.job_backend == "local" and os.geteuid() != 0:
        raise ConfigError(
            AS_SERVICE,
            f"the local job backend runs each job as its owner's system account, which needs "
            f"the service to run as root (it runs as uid {os.geteuid()}). Run the hub as root "
            f"(as for LocalProcessSpawner), use job_backend = 'slurm', or set "
            f"c.{AS_SERVICE} = True on a single-user or demo hub",
        )
    closed = _closed(manager.root.parents)
    if closed:
        raise ConfigError(
            "jobs_root",
            f"{closed} is not searchable by other users (o+x), so a job running as its "
            f"owner could not reach its folder in {manager.root}",
        )
    python = Path(manager.python).resolve()
    closed = _closed([*python.parents]) if app.job_backend == "local" else None
    if closed:
        raise ConfigError(
            "JobManager.runner_python",
            f"{closed} is not searchable by other users (o+x), so a job running as its "
            f"owner could not start {python}: install gpuslice where users can run it",
        )


def _closed(folders: Iterable[Path]) -> Path | None:
    """The first of ``folders`` that other users cannot search, if any."""
    for folder in folders:
        if not stat.S_IMODE(folder.stat().st_mode) & 0o001:
            return folder
    return None
