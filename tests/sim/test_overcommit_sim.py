"""Overcommit in the simulator, on one 80 GiB GPU, every figure worked out by hand: the
service's own overcommit charges a holder from the usage reports the simulated sessions
send, more shares fit, and what it costs (memory collisions, compute asked beyond the GPU)
is counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.sim.engine import Simulation
from benchmarks.sim.interactive import generate, load_parameters
from benchmarks.sim.measure import summary
from benchmarks.sim.policies import POLICIES, PROFILE_MILLI
from benchmarks.sim.workload import Session, Stretch, Workload

DAY = 86400.0
ONE_GPU = [
    {
        "name": "gpu000",
        "cpu_milli": 256000,
        "memory_mib": 2048000,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}],
    }
]


def share(i: int, arrival: float, seconds: float, busy: int, peak: float) -> Session:
    stretch = Stretch(seconds, busy)
    return Session(i, "user0", "g", arrival, "share-250", (stretch,), peak_memory_share=peak)


def workload(busy: int, peak: float) -> Workload:
    # user0 held a share for 2 hours using at most 0.3 x 20 GiB = 6144 MiB; at 10 000 s
    # they open five more
    first = share(0, 0, 7200, 100, 0.3)
    five = [share(i, 10000, 3600, busy, peak) for i in range(1, 6)]
    return Workload(1, [first, *five], hosts=ONE_GPU)


def run(w: Workload, overcommit: str, tmp_path: Path):
    policy = POLICIES["4"]
    if overcommit:
        policy = policy.vary("overcommit", overcommit)
    folder = tmp_path / (overcommit or "off")
    folder.mkdir()
    return Simulation(w, policy, seed=3, folder=folder).run()


def test_a_holder_with_room_gets_a_fifth_share_on_the_gpu(tmp_path: Path):
    w = workload(busy=200, peak=0.3)
    on = run(w, "1.25@1", tmp_path)
    # 6144 x 1.2 / 20480 = 0.36, bounded by 1 / 1.25: each of the five is charged 200 milli
    assert on.share_grants == 6 and on.overcommitted_grants == 5
    five = [q for q in on.requests if q.session >= 1]
    assert all(q.granted == 10000 and not q.refusals for q in five)
    assert on.memory_collisions == 0  # 5 x 6144 MiB of 81 920
    assert on.contention_milli_seconds == 0  # 5 x 200 milli: the whole GPU, no more
    s = summary(on)
    assert s["effective_utilization"] == pytest.approx((100 * 7200 + 5 * 200 * 3600) / (1000 * DAY))
    # without it the first share's history does nothing: four fit, the fifth is refused
    off = run(w, "", tmp_path)
    assert off.overcommitted_grants == 0
    assert sum(1 for q in off.requests if q.session >= 1 and q.refusals) == 1


def test_what_overcommit_costs_is_counted(tmp_path: Path):
    # the five now use 0.9 of their cap and keep 240 milli busy each: at their peaks the
    # fifth grant makes 5 x 18 432 = 92 160 MiB of 81 920 (one collision), and together they
    # ask 1 200 milli of the GPU for the hour, sampled at 10 800 and 12 600 s (every
    # 1 800 s): 200 milli beyond it for 2 x 1 800 s, taken off the useful work
    on = run(workload(busy=240, peak=0.9), "1.25@1", tmp_path)
    assert on.overcommitted_grants == 5 and on.memory_collisions == 1
    assert on.contention_milli_seconds == 200 * 3600
    s = summary(on)
    useful = 100 * 7200 + 5 * 240 * 3600 - 200 * 3600
    assert s["effective_utilization"] == pytest.approx(useful / (1000 * DAY))
    assert s["memory_collisions"] == 1 and s["contention_gpu_hours"] == pytest.approx(0.2)


def test_history_shorter_than_the_minimum_overcommits_nothing(tmp_path: Path):
    on = run(workload(busy=200, peak=0.3), "1.25@3", tmp_path)  # 2 hours held, 3 needed
    five = sorted((q for q in on.requests if q.session >= 1), key=lambda q: q.granted or 0)
    # four granted in full at 10 000 s, the fifth refused: 2 hours are not enough
    assert [q.granted for q in five[:4]] == [10000] * 4 and five[4].refusals
    # it gets its share once the four have stopped (at 13 600 s), their hours counting
    # (2 + 4 x 1 >= 3): it alone is charged less
    assert five[4].granted is not None and five[4].granted >= 13600
    assert on.overcommitted_grants == 1


def test_memory_peaks_come_from_their_own_random_stream():
    params = load_parameters()
    base = generate(params, 2, 7, PROFILE_MILLI)
    changed = {**params, "memory": {**params["memory"], "peak_median_share": 0.2}}
    other = generate(changed, 2, 7, PROFILE_MILLI)
    assert [replace(s, peak_memory_share=1.0) for s in base] == [
        replace(s, peak_memory_share=1.0) for s in other
    ]
    assert [s.peak_memory_share for s in base] != [s.peak_memory_share for s in other]
    assert all(0 < s.peak_memory_share <= 1 for s in base)
    # a user's sessions stay within the jitter of one habit
    by_user: dict[str, list[float]] = {}
    for s in base:
        by_user.setdefault(s.user, []).append(s.peak_memory_share)
    jitter = params["memory"]["session_jitter"]
    for peaks in by_user.values():
        assert max(peaks) <= min(peaks) * (1 + jitter) / (1 - jitter) + 1e-3


@pytest.mark.parametrize("value", ["0.9", "2.5", "1.2@0.5", "many"])
def test_bad_overcommit_values_are_refused(value: str):
    with pytest.raises(ValueError, match="overcommit must be"):
        POLICIES["4"].vary("overcommit", value)
