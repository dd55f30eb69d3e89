"""The job JSON the REST API returns (and the JupyterLab panel reads)."""

from __future__ import annotations

from typing import Any

from gpuslice.isotime import iso

from ..db.jobs_models import JobRow
from .states import ACTIVE


def output_path(job: JobRow) -> str:
    """Where the results land, relative to the user's notebook root."""
    return f"gpu-jobs/{job.name}-{job.id}"


def job_json(job: Any, log_tail: str = "", transitions: list[Any] | None = None) -> dict[str, Any]:
    """``job``: its ORM object or row; ``transitions``: its history, where ``job`` is a row
    (objects with ``JobTransitionRow``'s attributes)."""
    history = job.transitions if transitions is None else transitions
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "state": job.state,
        "profile": job.profile,
        "slices": job.slices,
        "priority": job.priority_class,
        "checkpoint_interval": job.checkpoint_interval,
        "max_runtime": job.max_runtime,
        "parameters": job.parameters or {},
        "path": job.notebook_path,
        "backend": job.backend,
        "restarts": job.restarts,
        "preemptions": job.preemptions,
        "lost_work_seconds": round(job.lost_work_seconds, 3),
        # while preempting: when the grace period ends (the run is killed then)
        "preempt_deadline": iso(job.preempt_deadline) if job.state == "preempting" else None,
        # Time on a GPU: the ended runs' total, and when the current run began (null while
        # none runs). ``started_at`` is the first run's start: it counts queued time after
        # a preemption, and the max runtime is checked against these instead.
        "run_seconds": round(job.run_seconds or 0.0, 3),
        "attempt_started_at": iso(job.attempt_started_at) if job.state in ACTIVE else None,
        "cells_done": job.cells_done,
        "cells_total": job.cells_total,
        "last_checkpoint_at": iso(job.last_checkpoint_at),
        "submitted_at": iso(job.submitted_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "waiting_reason": job.waiting_reason,
        "time_window": job.time_window,
        "burstable": bool(job.burstable),
        "bursts": job.bursts or 0,
        # in the burst partition now (sent there and not come back)
        "on_burst": bool((job.backend_ref or {}).get("burst")),
        "burst_gpu_hours": round((job.burst_gpu_seconds or 0.0) / 3600, 4),
        "error": job.error,
        "output_path": output_path(job),
        # when the owner's server copied the outputs there, and when the service removed
        # the job's own folder (jobs/folders.py): its log and outputs are then in theirs only
        "outputs_collected_at": iso(job.outputs_collected_at),
        "folder_removed_at": iso(job.folder_removed_at),
        "allocation_ids": list(job.allocation_ids or []),
        "log_tail": log_tail,
        "transitions": [
            {"state": t.state, "from": t.from_state, "at": iso(t.at), "reason": t.reason}
            for t in history
        ],
    }
