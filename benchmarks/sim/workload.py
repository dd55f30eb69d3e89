"""What a simulation replays: interactive sessions and batch jobs, in seconds from its start.

A workload says what people *want*, never what the cluster did with it: a session's
stretches of use and idleness play from the moment it gets a slice; a batch job's work is
the GPU time it needs. Policies decide what they get and when.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Stretch:
    """A stretch of a session: ``busy_milli`` of one GPU kept busy for ``seconds`` (0: idle).

    ``visible``: the GPU work runs in a kernel (a cell executes), which an inactivity
    culler sees as activity. A stretch that is not visible runs GPU work outside the
    kernel (a script started from a terminal, a background thread): busy on the GPU,
    silent to jupyterhub-idle-culler.
    """

    seconds: float
    busy_milli: int = 0
    visible: bool = True

    @property
    def active(self) -> bool:
        return self.busy_milli > 0


@dataclass(frozen=True)
class Session:
    """A researcher's server: asks for ``profile`` (the slice they would pick) at
    ``arrival``; then its stretches play. Once the stretches are over, it stops. A server of
    several whole GPUs keeps each of its ``gpus`` as busy as a stretch says.
    ``peak_memory_share``: the most GPU memory it uses, as a share of its profile's memory
    cap (held from its first use to its end: what a notebook's tensors and a framework's
    caching allocator do); 1 where nothing better is known."""

    id: int
    user: str
    group: str
    arrival: float
    profile: str
    stretches: tuple[Stretch, ...]
    gpus: int = 1
    peak_memory_share: float = 1.0

    @property
    def length(self) -> float:
        return sum(s.seconds for s in self.stretches)


@dataclass(frozen=True)
class BatchJob:
    """A notebook submitted as a batch job at ``arrival``: ``slices`` slices of ``profile``,
    ``work`` seconds of computation, keeping ``busy_milli`` of each GPU of each slice busy
    (a slice of a multi-GPU profile spans ``gpus`` GPUs). ``request_milli``: the share of
    one GPU the job needs, when it needs less than a GPU (openb's ``gpu_milli``): a policy
    with a finer share menu gives it a smaller slice than ``profile`` (0: not known, as in
    a ledger's history; ``profile`` is all it asks)."""

    id: int
    user: str
    group: str
    arrival: float
    profile: str
    work: float
    busy_milli: int
    slices: int = 1
    checkpoint_interval: float = 600.0
    gpus: int = 1
    request_milli: int = 0

    @property
    def busy_total(self) -> int:
        """Milli-GPUs the job keeps busy while it runs, over all its GPUs."""
        return self.busy_milli * self.gpus * self.slices


@dataclass
class Workload:
    """``days`` of sessions and jobs, and where they came from (said in the report);
    ``hosts``: the cluster they ran on (a site's inventory, in the simulated discovery's
    format), or None for the simulation's own."""

    days: float
    sessions: list[Session] = field(default_factory=list)
    jobs: list[BatchJob] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    hosts: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        sessions = [
            Session(**{**s, "stretches": tuple(Stretch(**t) for t in s["stretches"])})
            for s in data.get("sessions", [])
        ]
        jobs = [BatchJob(**j) for j in data.get("jobs", [])]
        sources = list(data.get("sources", []))
        return cls(float(data["days"]), sessions, jobs, sources, data.get("hosts"))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> Workload:
        return cls.from_json(json.loads(path.read_text()))
