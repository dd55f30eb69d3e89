"""The per-host score cache must not change any decision."""

import numpy as np
import pytest

from gpuslice_hub.placement.policies.default import Default
from gpuslice_hub.placement.policies.fgd import FGD
from gpuslice_hub.placement.policies.typical import typical_from_requests
from gpuslice_hub.placement.select import select
from gpuslice_hub.placement.types import Request

from .helpers import cluster


def stream(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        cpu, mem = int(rng.choice([1000, 4000, 8000])), int(rng.choice([2000, 16000, 40000]))
        kind = rng.choice(["share", "gpu", "none"])
        if kind == "share":
            out.append(Request("share", cpu, mem, gpu_milli=int(rng.choice([230, 470, 810]))))
        elif kind == "gpu":
            out.append(Request("gpu", cpu, mem, count=int(rng.choice([1, 2]))))
        else:
            out.append(Request("none", cpu, mem))
    return out


@pytest.mark.parametrize("policy_class", [FGD, Default])
def test_cached_and_uncached_runs_decide_the_same(policy_class):
    reqs = stream(300, seed=5)
    typical = typical_from_requests(reqs, memory=policy_class is Default)
    decisions = []
    for clear in (False, True):
        s = cluster(
            [[1000] * 4, [1000] * 2, [1000] * 8, [1000]] * 3,
            cpu=[32_000, 16_000, 64_000, 8_000] * 3,
            mem=[128_000, 64_000, 256_000, 32_000] * 3,
            rank=[5, 2, 9, 0, 11, 7, 1, 4, 10, 3, 8, 6],
        )
        policy = policy_class(typical)
        run = []
        for r in reqs:
            if clear:
                s.cache.clear()
            chosen = select(s, r, policy)
            run.append(chosen)
            if chosen is not None:
                s.apply(chosen[0], r, chosen[1])
        decisions.append(run)
    assert decisions[0] == decisions[1]
    assert sum(d is None for d in decisions[0]) > 0  # the cluster does fill up
