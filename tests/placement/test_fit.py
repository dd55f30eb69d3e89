"""Protocol section 3: the filter."""

import numpy as np

from gpuslice_hub.placement.fit import best_gpus, feasible_mask
from gpuslice_hub.placement.types import Request

from .helpers import cluster


def test_share_needs_one_gpu_with_enough_free():
    s = cluster([[300, 499], [500, 0], [1000]])
    assert feasible_mask(s, Request("share", gpu_milli=500)).tolist() == [False, True, True]


def test_multi_gpu_needs_that_many_fully_free_gpus():
    s = cluster([[1000, 999, 1000], [1000, 1000], [1000]])
    assert feasible_mask(s, Request("gpu", count=2)).tolist() == [True, True, False]
    assert feasible_mask(s, Request("gpu", count=3)).tolist() == [False, False, False]


def test_cpu_and_memory_must_fit_even_for_cpu_only():
    s = cluster([[1000], [1000], [0]], cpu=[999, 1000, 1000], mem=[10, 10, 9])
    req = Request("none", cpu_milli=1000, memory_mib=10)
    assert feasible_mask(s, req).tolist() == [False, True, False]


def test_gpu_spec_restricts_models():
    s = cluster([[1000], [1000]], models=["T4", "V100M16"])
    assert feasible_mask(s, Request("gpu", models=("V100M16", "V100M32"))).tolist() == [
        False,
        True,
    ]
    assert feasible_mask(s, Request("gpu")).tolist() == [True, True]


def test_best_gpu_choice():
    s = cluster([[1000, 400, 300, 400, 1000]])
    # a share takes the fitting GPU with the least free (lowest index on ties)
    assert best_gpus(s, 0, Request("share", gpu_milli=350)) == [1]
    assert best_gpus(s, 0, Request("share", gpu_milli=300)) == [2]
    # whole GPUs: the lowest-indexed fully free ones
    assert best_gpus(s, 0, Request("gpu", count=2)) == [0, 4]
    assert np.array_equal(s.gpu_free, [[1000, 400, 300, 400, 1000]])  # untouched
