"""The MIG variant's rounding, pool plan and partitioning."""

import numpy as np

from benchmarks.tracebench.mig import as_mig, layout_sequence, partition, plan, profile_for
from gpuslice_hub.placement.select import select
from gpuslice_hub.placement.types import Request

from .helpers import cluster


def test_rounding_up_to_profiles():
    # a profile of s sevenths holds floor(s * 1000 / 7) milli: 142, 285, 428, 571
    assert profile_for(100) == "1g.10gb"
    assert profile_for(142) == "1g.10gb"
    assert profile_for(143) == "2g.20gb"
    assert profile_for(470) == "4g.40gb"
    assert profile_for(571) == "4g.40gb"
    assert profile_for(572) is None
    assert as_mig(Request("share", cpu_milli=5, gpu_milli=810)) == Request("gpu", cpu_milli=5)
    assert as_mig(Request("share", gpu_milli=320)).mig_profile == "3g.40gb"
    assert as_mig(Request("gpu", count=2)) == Request("gpu", count=2)


def test_plan_splits_by_demand():
    reqs = [Request("gpu")] * 2 + [Request("share", gpu_milli=500)] * 7  # 14 vs 28 sevenths
    # whole: round(9 * 14/42) = 3; the rest is all 4g demand
    assert plan(reqs, 9) == {"whole": 3, "4g+3g": 6, "3g+2g+1g+1g": 0}


def test_layouts_interleave():
    assert layout_sequence({"a": 2, "b": 2}) == ["a", "b", "a", "b"]
    seq = layout_sequence({"whole": 1, "4g+3g": 3})
    assert sorted(seq) == ["4g+3g"] * 3 + ["whole"]


def test_partitioned_gpus_take_only_their_profiles():
    s = cluster([[1000, 1000]])
    partition(s, np.array([0]), {"whole": 1, "4g+3g": 1, "3g+2g+1g+1g": 0})
    assert s.gpu_ok.tolist() == [[False, True]] or s.gpu_ok.tolist() == [[True, False]]
    mig_gpu = int(np.flatnonzero(s.mig_ok[0])[0])
    got = select(s, Request("mig", mig_profile="3g.40gb"), _first_fit())
    assert got == (0, [mig_gpu])
    assert select(s, Request("mig", mig_profile="1g.10gb"), _first_fit()) is None
    assert select(s, Request("gpu", count=2), _first_fit()) is None


def _first_fit():
    from gpuslice_hub.placement import get_policy

    return get_policy("first-fit")
