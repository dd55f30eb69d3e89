"""Where a job's runner runs: a local subprocess, a Slurm job or a Kubernetes Job."""

from __future__ import annotations

from .base import Backend, RunStatus
from .local import LocalBackend

__all__ = ["Backend", "LocalBackend", "RunStatus"]
