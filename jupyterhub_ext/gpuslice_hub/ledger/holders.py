"""Who holds the ledger's external allocations: an engine's work that did not come through
gpuslice (an external allocation's profile is ``<engine>:<gres>``, e.g. ``slurm:gpu:1g.10gb``
or ``kubernetes:shard``)."""

from __future__ import annotations

HOLDERS = {"Slurm": "Slurm jobs", "Kubernetes": "Kubernetes pods"}


def engine_of(profile: str) -> str:
    """The engine whose work holds an external allocation of ``profile``."""
    prefix = profile.partition(":")[0]
    return next((e for e in HOLDERS if e.lower() == prefix), "Slurm")
