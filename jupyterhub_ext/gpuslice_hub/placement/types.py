"""Inputs and outputs of placement: plain values, no database, no I/O.

The service builds ``HostState`` values from the ledger for every decision; the trace
benchmark builds them from the openb CSVs. Both call :func:`gpuslice_hub.placement.place`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

RequestKind = Literal["none", "share", "gpu", "mig"]


@dataclass
class MigSlotState:
    uuid: str
    profile: str
    memory_mib: int
    milli: int
    free: bool = True


@dataclass
class GPUState:
    uuid: str
    model: str
    memory_mib: int
    free_milli: int = 1000
    free_memory_mib: int = -1  # -1: same as memory_mib (filled in __post_init__)
    # Non-empty means the GPU is in MIG mode: only its instances can be handed out.
    mig: list[MigSlotState] = field(default_factory=list)
    # A drained GPU takes no new work (admin action); existing holders keep it.
    drained: bool = False

    def __post_init__(self) -> None:
        if self.free_memory_mib < 0:
            self.free_memory_mib = self.memory_mib

    @property
    def is_mig(self) -> bool:
        return bool(self.mig)

    @property
    def fully_free(self) -> bool:
        return not self.mig and self.free_milli >= 1000 and not self.drained


@dataclass
class HostState:
    name: str
    cpu_milli_free: int
    memory_mib_free: int
    gpus: list[GPUState] = field(default_factory=list)
    # Tie-break: among equal scores the lowest rank wins (stable, decided once per host).
    rank: int = 0


@dataclass(frozen=True)
class Request:
    """What one session or job asks for, on one host.

    ``share``: ``gpu_milli`` (< 1000) of one GPU plus a memory cap ``gpu_memory_mib``
    (0 = no cap); ``gpu``: ``count`` whole GPUs; ``mig``: one free instance of
    ``mig_profile``; ``none``: CPU and memory only.
    """

    kind: RequestKind
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    count: int = 1
    mig_profile: str = ""
    models: tuple[str, ...] = ()  # allowed GPU models; empty allows any

    @property
    def total_gpu_milli(self) -> int:
        """The GPU demand in milli-GPU, the unit allocation is measured in."""
        if self.kind == "share":
            return self.gpu_milli
        if self.kind == "gpu":
            return 1000 * self.count
        return 0


@dataclass(frozen=True)
class Assignment:
    gpu_uuid: str
    milli: int
    memory_mib: int
    mig_uuid: str | None = None


@dataclass(frozen=True)
class Placement:
    host: str
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True)
class Refusal:
    """Why nothing fits, in words a researcher understands."""

    reason: str
