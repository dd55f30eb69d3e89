"""What a simulation replays: interactive sessions and batch jobs, in seconds from its start.

A workload says what people *want*, never what the cluster did with it: a session's
stretches of use and idleness play from the moment it gets a slice; a batch job's work is
the GPU time it needs. Policies decide what they get and when.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, Field, asdict, dataclass, field
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
    format), or None for the simulation's own; ``profiles``: the site's own profiles its
    sessions and jobs ask for beyond the simulator's catalog (``policies.PROFILES``), in
    the service's profile format."""

    days: float
    sessions: list[Session] = field(default_factory=list)
    jobs: list[BatchJob] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    hosts: list[dict[str, Any]] | None = None
    profiles: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Workload:
        """The workload ``data`` (``to_json``'s) describes; WorkloadError says what is wrong
        with it, and where."""
        if not isinstance(data, dict):
            raise WorkloadError(f"must be a JSON object, not {_json_type(data)}")
        days = data.get("days")
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not 0 < days < 1e6:
            raise WorkloadError(f"days must be a number above 0, got {days!r}")
        sessions = [
            _item(Session, f"sessions[{i}]", s, stretches=True)
            for i, s in enumerate(_list(data, "sessions"))
        ]
        jobs = [_item(BatchJob, f"jobs[{i}]", j) for i, j in enumerate(_list(data, "jobs"))]
        sources = [str(x) for x in _list(data, "sources")]
        hosts = data.get("hosts")
        if hosts is not None and not isinstance(hosts, list):
            raise WorkloadError(f"hosts must be a list or null, not {_json_type(hosts)}")
        profiles = _list(data, "profiles")
        if not all(isinstance(p, dict) for p in profiles):
            raise WorkloadError("profiles must be a list of objects")
        return cls(float(days), sessions, jobs, sources, hosts, profiles)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> Workload:
        """The workload saved at ``path``; WorkloadError names the file and what is wrong."""
        try:
            text = path.read_text()
        except OSError as e:
            raise WorkloadError(f"{path}: cannot read it ({e.strerror or e})") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise WorkloadError(f"{path}: not JSON ({e})") from None
        try:
            return cls.from_json(data)
        except WorkloadError as e:
            raise WorkloadError(f"{path}: {e}") from None


class WorkloadError(ValueError):
    """A saved workload that cannot be replayed: the message says why."""


def _json_type(value: Any) -> str:
    names = {list: "a list", dict: "an object", str: "a string", bool: "true or false"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise WorkloadError(f"{key} must be a list, not {_json_type(value)}")
    return value


_NUMBERS: tuple[type, ...] = (int, float)


def dataclass_fields(kind: type) -> dict[str, Field[Any]]:
    return getattr(kind, "__dataclass_fields__")  # noqa: B009 (not a known attribute to mypy)


def _item(kind: type, where: str, raw: Any, stretches: bool = False) -> Any:
    """A Session or BatchJob from its JSON object, each field present and of its type."""
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where} must be an object, not {_json_type(raw)}")
    fields = dataclass_fields(kind)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise WorkloadError(f"{where}: unknown field {unknown[0]!r}")
    values = dict(raw)
    if stretches:
        items = values.get("stretches")
        if not isinstance(items, list):
            raise WorkloadError(f"{where}.stretches must be a list, not {_json_type(items)}")
        values["stretches"] = tuple(
            _item(Stretch, f"{where}.stretches[{k}]", t) for k, t in enumerate(items)
        )
    for name, f in fields.items():
        if name not in values:
            if f.default is MISSING:
                raise WorkloadError(f"{where}: missing field {name!r}")
            continue
        value, want = values[name], _TYPES.get(f.type if isinstance(f.type, str) else "")
        if want is None:
            continue
        ok = isinstance(value, want) and not (isinstance(value, bool) and bool not in want)
        if not ok:
            raise WorkloadError(f"{where}.{name} must be {_SAID[want]}, got {value!r}")
        if want in (_NUMBERS, (int,)) and not (
            math.isfinite(value) and value >= _LEAST.get(name, 0)
        ):
            least = _LEAST.get(name, 0)
            said = "above 0" if least == _ABOVE_0 else f"{least} or more"
            raise WorkloadError(f"{where}.{name} must be {said}, got {value!r}")
    return kind(**values)


_ABOVE_0 = 1e-9
# fields with a floor other than 0: a job's work, and a slice's or server's GPUs
_LEAST: dict[str, float] = {"work": _ABOVE_0, "slices": 1, "gpus": 1, "checkpoint_interval": 1}


_TYPES: dict[str, tuple[type, ...]] = {
    "float": _NUMBERS,
    "int": (int,),
    "str": (str,),
    "bool": (bool,),
}
_SAID: dict[tuple[type, ...], str] = {
    _NUMBERS: "a number",
    (int,): "a whole number",
    (str,): "a string",
    (bool,): "true or false",
}
