"""The baselines' node scores (protocol section 4) on hand-built hosts."""

import numpy as np
import pytest

from gpuslice_hub.placement import POLICIES, get_policy
from gpuslice_hub.placement.policies.packing import GpuClustering, GpuPacking
from gpuslice_hub.placement.policies.simple import BestFit, DotProd, Random
from gpuslice_hub.placement.select import select
from gpuslice_hub.placement.types import Request

from .helpers import cluster

ALL = np.array([0, 1, 2])


def test_best_fit_scores():
    s = cluster([[1000, 1000], [500, 0], [1000] * 8], cpu=[64_000, 32_000, 128_000])
    req = Request("share", cpu_milli=8000, gpu_milli=500)
    # s = 0.5*(cL-8000)/128000 + 0.5*(gL-500)/8000; score = floor(100*(1-s))
    # h0: 0.21875 + 0.09375 = 0.3125 -> 68; h1: 0.09375 + 0 -> 90; h2: 0.46875+0.46875 -> 6
    assert BestFit().scores(s, req, ALL).tolist() == [68, 90, 6]


def test_dotprod_scores():
    s = cluster([[1000, 1000], [500, 0], [1000] * 8], cpu=[64_000, 32_000, 128_000])
    req = Request("gpu", cpu_milli=16_000, count=1)
    # d = (cL/128000)(16000/128000) + (gL/8000)(1000/8000); score = floor(100(1-d/2))
    # h0: 0.0625 + 0.03125 = 0.09375 -> 95.3 -> 95; h1: 0.03125 + 0.0078125 -> 98.05 -> 98
    # h2: 0.125 + 0.125 = 0.25 -> 87.5 -> 87
    assert DotProd().scores(s, req, ALL).tolist() == [95, 98, 87]


def test_gpu_packing_scores():
    s = cluster([[1000, 1000], [1000, 640], [1000, 0, 1000, 1000]])
    share = Request("share", gpu_milli=300)
    # h0 all free: 33 - 2 = 31; h1 tightest fitting GPU has 640 free:
    # 100 - floor(floor(640*100/1000)/10) = 100 - 6 = 94; h2 tightest is fully free: 50 - 1 = 49
    assert GpuPacking().scores(s, share, ALL).tolist() == [31, 94, 49]
    two = Request("gpu", count=2)
    assert GpuPacking().scores(s, two, np.array([0, 2])).tolist() == [31, 48]
    assert GpuPacking().scores(s, Request("none"), ALL).tolist() == [0, 0, 0]


def test_gpu_clustering_scores():
    s = cluster([[1000, 1000], [1000, 1000], [1000, 1000]])
    s.apply(1, Request("share", gpu_milli=200), [0])  # h1 tags {share}, 1800 free
    s.apply(2, Request("share", gpu_milli=200), [0])
    s.apply(2, Request("gpu", count=1), [1])  # h2 tags {share, 1-gpu}, 800 free
    share = Request("share", gpu_milli=100)
    # base = floor(25*(8000-gL)/8000): h0 18, h1 19, h2 22
    # h0 has no GPU pods: +25; h1 only share: +75; h2 share among several: +50
    assert GpuClustering().scores(s, share, ALL).tolist() == [43, 94, 72]
    # a 1-GPU request: h0 +25, h1 other tag only: +0, h2 among several: +50
    assert GpuClustering().scores(s, Request("gpu"), ALL).tolist() == [43, 19, 72]


def test_ties_go_to_lowest_rank():
    s = cluster([[1000], [1000], [1000]], rank=[2, 0, 1])
    assert select(s, Request("gpu"), get_policy("first-fit")) == (1, [0])
    assert select(s, Request("gpu"), get_policy("best-fit")) == (1, [0])


def test_random_picks_only_feasible_hosts_and_fitting_gpus():
    s = cluster([[100, 900, 900], [0], [1000]])
    policy = Random(seed=1)
    seen = set()
    for _ in range(50):
        node, gpus = select(s, Request("share", gpu_milli=800), policy)
        seen.add((node, gpus[0]))
    assert seen == {(0, 1), (0, 2), (2, 0)}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_places_every_kind(name):
    s = cluster([[1000, 1000], [400]])
    policy = get_policy(name)
    for req, expect_node in [
        (Request("gpu", count=2), 0),
        (Request("share", gpu_milli=300), None),
        (Request("none", cpu_milli=10), None),
    ]:
        node, gpus = select(s, req, policy)
        assert expect_node is None or node == expect_node
        assert len(gpus) == (0 if req.kind == "none" else req.count)
    assert select(s, Request("share", gpu_milli=1000, models=("A100",)), policy) is None


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown placement policy"):
        get_policy("nope")


def test_default_sends_cpu_only_work_where_gpus_are_taken():
    from gpuslice_hub.placement.policies.default import Default
    from gpuslice_hub.placement.policies.fgd import FGD

    from .test_frag import typical

    # Typical: 1-GPU requests with 1 CPU. Both hosts keep >= 1 CPU after a 2-CPU request,
    # so FGD scores them the same (fragmentation unchanged) and the rank decides (h0);
    # the default policy picks h1, whose GPU is already taken.
    t = typical([(1000, 1000, 1, 1.0)])
    s = cluster([[1000], [0]], cpu=[8000, 8000], rank=[0, 1])
    req = Request("none", cpu_milli=2000)
    assert FGD(t).choose(s, req, np.array([0, 1])) == (0, [])
    assert Default(t).choose(s, req, np.array([0, 1])) == (1, [])
