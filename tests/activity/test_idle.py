import pytest

from gpuslice.activity import (
    SERVER_KEY,
    Activity,
    ActivityReport,
    Attribution,
    IdleTracker,
    IdleTrackers,
)


def feed(tracker, start, end, util=0.0, step=5.0, **kw):
    state = None
    t = start
    while t < end:
        state = tracker.observe(t, util, **kw)
        t += step
    return state


def test_idle_accumulates_in_whole_windows_only():
    tr = IdleTracker(window=30, threshold=1.0)
    assert feed(tr, 0, 30).idle_seconds == 0  # t=25: the first window is not over
    s = tr.observe(30, 0.0)
    assert (s.idle_seconds, s.idle_since, s.is_idle) == (30, 0, True)
    s = feed(tr, 35, 95)
    assert s.idle_seconds == 90
    assert s.idle_since == 0


def test_one_busy_tick_resets_the_run():
    tr = IdleTracker(window=30)
    feed(tr, 0, 35)
    assert tr.state.idle_seconds == 30
    tr.observe(40, 55.0)  # busy inside [30, 60)
    s = feed(tr, 45, 65)
    assert s.idle_seconds == 0 and s.idle_since is None
    s = feed(tr, 65, 95)
    assert (s.idle_seconds, s.idle_since) == (30, 60)


@pytest.mark.parametrize("util, idle", [(0.0, True), (0.99, True), (1.0, False), (80.0, False)])
def test_threshold(util, idle):
    tr = IdleTracker(window=30, threshold=1.0)
    s = feed(tr, 0, 35, util=util)
    assert s.is_idle is idle


def test_executing_kernel_is_not_idle_even_with_zero_util():
    tr = IdleTracker(window=30)
    assert not feed(tr, 0, 65, executing=True).is_idle


def test_last_execution_inside_the_window_makes_it_busy():
    tr = IdleTracker(window=30)
    tr.observe(0, 0.0)
    tr.observe(10, 0.0, last_execution=8.0)  # a short cell ran at t=8, between ticks
    s = feed(tr, 15, 65, last_execution=8.0)
    # [0, 30) was busy; [30, 60) saw only an execution from before it started
    assert (s.idle_seconds, s.idle_since) == (30, 30)


def test_memory_held_while_idle_is_still_idle_and_reported():
    tr = IdleTracker(window=30)
    s = feed(tr, 0, 35, memory_bytes=2 << 30)
    assert s.is_idle and s.holds_memory


def test_unknown_utilization_falls_back_to_execution_and_says_so():
    tr = IdleTracker(window=30)
    s = feed(tr, 0, 35, util=None)
    assert s.is_idle and s.gpu_evidence is False
    tr2 = IdleTracker(window=30)
    assert feed(tr2, 0, 35, util=None, executing=True).is_idle is False
    s = feed(IdleTracker(window=30), 0, 35, util=0.0)
    assert s.gpu_evidence is True


def test_windows_without_observations_neither_add_nor_reset():
    tr = IdleTracker(window=30)
    feed(tr, 0, 35)  # [0, 30) idle
    s = tr.observe(3600.0, 0.0)  # the sampler stalled for an hour
    assert s.idle_seconds == 60  # [0, 30) and [30, 60) were observed; the gap adds nothing
    s = tr.observe(3630.0, 0.0)
    assert s.idle_seconds == 90


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        IdleTracker(window=0)


def _report(t, kernels, server_util=0.0):
    return ActivityReport(
        time=t,
        kernels={k: Activity(u, 0, Attribution.PER_PROCESS) for k, u in kernels.items()},
        server=Activity(server_util, 0, Attribution.PER_PROCESS),
    )


def test_trackers_per_kernel_and_server():
    trs = IdleTrackers(window=30)
    for t in range(0, 65, 5):
        states = trs.update(_report(t, {"a": 0.0, "b": 90.0}, server_util=0.0))
    assert states["a"].idle_seconds == 60
    assert states["b"].idle_seconds == 0
    assert states[SERVER_KEY].idle_seconds == 60
    states = trs.update(_report(65, {"b": 0.0}), executing={"b": True})
    assert set(states) == {"b", SERVER_KEY}
    assert "a" not in trs.trackers
