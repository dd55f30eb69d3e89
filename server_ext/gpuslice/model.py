"""The shared model: what a GPU inventory looks like, independent of how it was found.

Discovery backends (``gpuslice.gpu``) produce these; the hub service stores them and the
placement engine works on a resource view built from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class MigMode(str, Enum):
    """MIG state of a GPU, as far as the backend could tell."""

    DISABLED = "disabled"
    ENABLED = "enabled"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance that a session can hold on its own."""

    uuid: str  # "MIG-…", what CUDA_VISIBLE_DEVICES takes
    profile: str  # e.g. "1g.18gb"
    memory_mib: int
    # Compute fraction in milli-GPU (a 1g slice of a 7-slice GPU is 142), so MIG and
    # time-sliced shares can be compared and accounted in the same unit.
    milli: int
    gi_id: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class GPU:
    uuid: str
    host: str
    index: int
    model: str
    memory_mib: int
    mig_mode: MigMode = MigMode.DISABLED
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def is_mig(self) -> bool:
        return self.mig_mode is MigMode.ENABLED


@dataclass(frozen=True)
class Host:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GPU, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Inventory:
    """Everything one discovery backend found, and which backend found it."""

    backend: str
    hosts: tuple[Host, ...]
    # True when the GPUs are not real (the ``simulated`` backend): shown to every user.
    simulated: bool = False

    def gpus(self) -> list[GPU]:
        return [g for h in self.hosts for g in h.gpus]
