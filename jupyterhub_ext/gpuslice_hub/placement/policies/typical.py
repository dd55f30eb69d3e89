"""The "typical pods" FGD measures fragmentation against, fixed or learned online.

A shape is (cpu, per-GPU milli, GPU count, allowed models). The typical set is the most
frequent shapes covering ``coverage`` of all requests, with frequencies renormalised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..types import Request

Shape = tuple[int, int, int, tuple[str, ...]]


def shape_of(request: Request) -> Shape | None:
    """The FGD shape of a request; MIG requests have none (they do not use shares)."""
    if request.kind == "share":
        return (request.cpu_milli, request.gpu_milli, 1, request.models)
    if request.kind == "gpu":
        return (request.cpu_milli, 1000, request.count, request.models)
    if request.kind == "none":
        return (request.cpu_milli, 0, 0, ())
    return None


@dataclass(frozen=True)
class Typical:
    cpu: np.ndarray  # int64[T]
    milli: np.ndarray  # int64[T], per GPU
    count: np.ndarray  # int64[T], 0 for CPU-only
    models: tuple[tuple[str, ...], ...]
    # float64[T]: how often each shape is requested, on any scale (frag.py divides by the
    # sum). Request counts, so that fragmentation is computed exactly (frag.py).
    weight: np.ndarray
    version: int = 0
    # Mean host memory (MiB) of each shape's requests; None: memory is not considered
    # (FGD as published ignores it).
    mem: np.ndarray | None = None

    @property
    def any_model(self) -> bool:
        return not any(self.models)


def typical_from_counts(
    counts: Counter[Shape],
    coverage: float = 0.95,
    version: int = 0,
    mem_sums: dict[Shape, float] | None = None,
) -> Typical:
    """The shortest most-frequent prefix covering ``coverage`` of the requests."""

    def order(item: tuple[Shape, int]) -> tuple:
        (cpu, milli, count, models), n = item
        return (-n, -cpu, -milli, -count, tuple(-ord(ch) for ch in "|".join(models)))

    items = sorted(counts.items(), key=order)
    total = sum(counts.values())
    kept: list[tuple[Shape, int]] = []
    cum = 0
    for item in items:
        kept.append(item)
        cum += item[1]
        if cum >= coverage * total:
            break
    weight = np.array([n for _, n in kept], float)
    return Typical(
        cpu=np.array([s[0] for s, _ in kept], np.int64),
        milli=np.array([s[1] for s, _ in kept], np.int64),
        count=np.array([s[2] for s, _ in kept], np.int64),
        models=tuple(s[3] for s, _ in kept),
        weight=weight,
        version=version,
        mem=None if mem_sums is None else np.array([mem_sums[s] / n for s, n in kept]),
    )


def typical_from_requests(
    requests: Iterable[Request], coverage: float = 0.95, memory: bool = False
) -> Typical:
    counts: Counter[Shape] = Counter()
    mem: Counter[Shape] = Counter()
    for r in requests:
        s = shape_of(r)
        if s is not None:
            counts[s] += 1
            mem[s] += r.memory_mib
    sums = {s: float(v) for s, v in mem.items()} if memory else None
    return typical_from_counts(counts, coverage, mem_sums=sums)


class OnlineTypical:
    """The typical set of the requests seen so far.

    Rebuilding changes every fragmentation score, so it happens only when the empirical
    distribution has drifted (total variation over ``drift``) from the one in use; checks run
    on a doubling schedule at first, then every ``check_every`` requests.
    """

    def __init__(
        self,
        coverage: float = 0.95,
        drift: float = 0.02,
        check_every: int = 128,
        memory: bool = False,
    ):
        self.coverage = coverage
        self.memory = memory
        self.mem: Counter[Shape] = Counter()
        self.drift = drift
        self.check_every = check_every
        self.counts: Counter[Shape] = Counter()
        self.seen = 0
        self.current: Typical | None = None
        self._basis: dict[Shape, float] = {}

    def observe(self, request: Request) -> None:
        s = shape_of(request)
        if s is None:
            return
        self.counts[s] += 1
        self.mem[s] += request.memory_mib
        self.seen += 1
        n = self.seen
        due = n & (n - 1) == 0 if n < self.check_every else n % self.check_every == 0
        if self.current is None or (due and self._drifted()):
            self._rebuild()

    def _drifted(self) -> bool:
        tv = 0.0
        for s, c in self.counts.items():
            tv += abs(c / self.seen - self._basis.get(s, 0.0))
        return tv / 2 > self.drift

    def _rebuild(self) -> None:
        version = 0 if self.current is None else self.current.version + 1
        mem = {s: float(v) for s, v in self.mem.items()} if self.memory else None
        self.current = typical_from_counts(self.counts, self.coverage, version, mem)
        self._basis = {s: c / self.seen for s, c in self.counts.items()}
