"""Protocol section 5: column k averages rounded allocation over rows with rounded arrival k."""

import numpy as np

from benchmarks.tracebench.columns import columns


def test_columns_hand_computed():
    # total_gpus = 1, so percent = milli / 10.
    # arrived %: 99.5 -> 100 (half to even), 100.0, 100.4 -> 100, 100.6 -> 101, 110.0, 119.0
    arrived = np.array([995, 1000, 1004, 1006, 1100, 1190])
    used = np.array([900, 901, 905, 906, 950, 960])  # % 90.0, 90.1, 90.5, 90.6, 95.0, 96.0
    cols = columns(arrived, used, total_gpus=1)
    assert cols["100"] == 90.2  # mean(90.0, 90.1, 90.5) = 90.2
    assert cols["110"] == 95.0
    # no row rounds to 120: the rows with 119 <= a <= 121 are used instead
    assert cols["120"] == 96.0
    assert cols["130"] is None


def test_used_is_rounded_before_averaging():
    # 0.125 % and 0.135 %: used rounds each to two decimals first (0.12, 0.14 on binary values)
    arrived = np.array([1000, 1000])
    used = np.array([1.25, 1.35])
    cols = columns(arrived, used, total_gpus=1, ks=(100,))
    assert cols["100"] == round((round(0.125, 2) + round(0.135, 2)) / 2, 2)
