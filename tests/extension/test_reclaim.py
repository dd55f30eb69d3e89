"""The idle rules on their own: deadlines, warnings, keep-alive, server mode, memory caps."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpuslice.activity import SERVER_KEY, IdleState
from gpuslice.extension.app import GPUSliceExtension
from gpuslice.extension.memcap import MemoryCap
from gpuslice.extension.reclaim import ExtensionRefused, Reclaimer
from gpuslice.idle_policy import IdlePolicy, PolicyConfig, PolicyError

POLICY = IdlePolicy(idle_timeout=100, warning_lead=20, max_extension=50)


def idle(since, now):
    return IdleState(now - since, since, True, False)


BUSY = IdleState(0.0, None, True, False)


def run(r, times, since=0.0, kernels=("k",), active=None):
    """Feed a constant idle run from *since*; returns (time, decision) pairs."""
    out = []
    for t in times:
        states = {k: idle(since, t) for k in kernels}
        states[SERVER_KEY] = idle(since, t)
        for d in r.observe(t, states, active or {}):
            out.append((t, d))
    return out


def test_warning_precedes_the_cull_by_the_lead():
    r = Reclaimer(POLICY)
    got = run(r, range(0, 200, 5))
    assert [(t, d.action, d.kernel_id) for t, d in got] == [
        (80, "warning", "k"),
        (100, "culled", "k"),
    ]
    assert got[0][1].deadline == 100


def test_a_late_warning_moves_the_cull_back():
    # The first tick comes well after the deadline (the server just started): warned now,
    # culled only a full lead later.
    r = Reclaimer(POLICY)
    got = run(r, [150, 160, 169, 170, 175])
    assert [(t, d.action) for t, d in got] == [(150, "warning"), (170, "culled")]
    assert got[0][1].deadline == 170


def test_active_kernel_is_never_culled_and_its_warning_is_dropped():
    r = Reclaimer(POLICY)
    run(r, [85])  # warned
    assert r.warned("k")
    # Executing at 90: the tracker still reports the old run until its window closes.
    assert r.observe(90, {"k": idle(0, 90), SERVER_KEY: BUSY}, {"k": True}) == []
    assert not r.warned("k") and r.deadline("k") is None
    assert r.observe(95, {"k": idle(0, 95), SERVER_KEY: BUSY}, {}) == []
    assert r.deadline("k") is None
    # A new run (starting after the activity) gets a fresh deadline and warning.
    got = run(r, range(100, 300, 5), since=120)
    assert [(t, d.action) for t, d in got] == [(200, "warning"), (220, "culled")]


def test_keepalive_moves_the_deadline_and_is_bounded():
    r = Reclaimer(POLICY)
    run(r, [80])  # warned on time: deadline 100
    [d] = r.extend(["k"], 30, now=86)
    assert (d.action, d.deadline) == ("extended", 130)
    assert r.deadline("k") == 130 and not r.warned("k")
    assert r.extension_left(["k"]) == 20
    with pytest.raises(ExtensionRefused, match="at most 20 s more"):
        r.extend(["k"], 21, now=87)
    got = run(r, range(90, 200, 5))
    assert [(t, d.action) for t, d in got] == [(110, "warning"), (130, "culled")]


def test_activity_after_a_keepalive_never_brings_the_cull_forward():
    # Server mode: kept alive until 40, then a kernel starts at 9 (activity, then a new
    # idle run from 10). That run alone would be culled at 20; the promise holds it to 40.
    r = Reclaimer(IdlePolicy(action="server", idle_timeout=10, warning_lead=5, max_extension=50))
    got = run(r, range(0, 10), kernels=())
    assert [(t, d.action) for t, d in got] == [(5, "warning")]
    [d] = r.extend(["k"], 30, now=8)
    assert d.deadline == 40
    states = {"k": BUSY, SERVER_KEY: idle(0, 9)}  # the kernel just started
    assert r.observe(9, states, {}) == [] and r.deadline("k") is None
    out = []
    for t in range(10, 60):
        states = {"k": idle(10, t), SERVER_KEY: idle(0, t)}
        out += [(t, d.action) for d in r.observe(t, states, {})]
    assert out == [(35, "warning"), (40, "culled")]


def test_a_new_idle_run_that_keeps_the_promised_deadline_is_not_warned_twice():
    # Kept alive until 40 and warned at 35; then at 36 the server's idle run is counted
    # from 20 (what it combines changed, without any activity). Its own deadline would be
    # 30: the promised 40 holds, the person was told it, and is not told again (nor is the
    # cull put back by a second warning's lead).
    r = Reclaimer(IdlePolicy(action="server", idle_timeout=10, warning_lead=5, max_extension=50))
    run(r, range(0, 10), kernels=())
    r.extend(["k"], 30, now=8)
    out = [(t, d.action) for t, d in run(r, range(10, 36), kernels=())]
    assert out == [(35, "warning")]
    for t in range(36, 60):
        out += [(t, d.action) for d in r.observe(t, {SERVER_KEY: idle(20, t)}, {})]
    assert out == [(35, "warning"), (40, "culled")]


def test_keepalive_after_the_deadline_counts_from_now():
    r = Reclaimer(POLICY)
    run(r, [150])  # late warning, cull at 170
    [d] = r.extend(["k"], 10, now=165)
    assert d.deadline == 180


def test_keepalive_on_a_kernel_that_is_not_idle_changes_nothing():
    r = Reclaimer(POLICY)
    r.observe(10, {"k": BUSY, SERVER_KEY: BUSY}, {})
    assert r.extend(["k"], 10, now=11) == []
    assert r.deadline("k") is None


def test_exempt_and_disabled_policies_never_cull():
    for policy in (IdlePolicy(exempt=True, exempt_reason="x"), IdlePolicy(idle_timeout=0)):
        r = Reclaimer(policy)
        assert run(r, range(0, 100000, 500)) == []


def test_server_mode_waits_for_the_last_kernel():
    r = Reclaimer(IdlePolicy(action="server", idle_timeout=100, warning_lead=20))
    out = []
    for t in range(0, 300, 5):
        states = {"a": idle(0, t), "b": idle(50, t) if t >= 50 else BUSY, SERVER_KEY: idle(0, t)}
        out += [(t, d.action, d.kernel_id) for d in r.observe(t, states, {})]
    assert out == [(130, "warning", None), (150, "culled", None)]
    assert r.deadline("a") == r.deadline("b") == r.server_deadline() == 150


def test_server_mode_any_activity_blocks():
    r = Reclaimer(IdlePolicy(action="server", idle_timeout=100, warning_lead=20))
    for t in range(0, 300, 5):
        states = {"a": idle(0, t), SERVER_KEY: idle(0, t)}
        assert r.observe(t, states, {SERVER_KEY: True}) == []


def test_failed_server_cull_is_retried_later():
    r = Reclaimer(IdlePolicy(action="server", idle_timeout=100, warning_lead=20))
    got = run(r, range(0, 105, 5), kernels=())
    assert got[-1][1].action == "culled"
    r.cull_failed(None, 100, retry_after=30)
    assert run(r, range(105, 130, 5), kernels=()) == []
    assert [d.action for _, d in run(r, [130], kernels=())] == ["culled"]


def test_memory_cap_warns_then_acts_on_that_kernel_only():
    MiB = 1024 * 1024
    cap = MemoryCap(1000, "shutdown", grace=30)
    [w] = cap.observe(0, {"a": 500 * MiB, "b": 2000 * MiB})
    assert (w.action, w.kernel_id, w.deadline) == ("memory-warning", "b", 30)
    assert "(2000 of 1000 MiB)" in w.reason
    assert w.reason.endswith("; shut down in 30 s if still over")
    assert cap.observe(29, {"a": 500 * MiB, "b": 2000 * MiB}) == []
    [c] = cap.observe(30, {"a": 500 * MiB, "b": 2000 * MiB})
    assert (c.action, c.kernel_id) == ("memory-culled", "b")
    assert c.reason.endswith("; it was shut down")
    # Back under the cap: the next excess is warned afresh.
    assert cap.observe(31, {"b": 10 * MiB}) == []
    assert [d.action for d in cap.observe(40, {"b": 1500 * MiB})] == ["memory-warning"]


def test_memory_cap_warn_only_never_acts():
    cap = MemoryCap(1000, "warn", grace=1)
    big = {"a": 5000 * 1024 * 1024}
    [w] = cap.observe(0, big)
    assert w.action == "memory-warning" and w.deadline is None
    # the reason promises nothing that will not happen
    assert w.reason == "kernel is over its GPU memory cap (5000 of 1000 MiB)"
    assert all(cap.observe(t, big) == [] for t in range(1, 100))


def test_policy_config_resolution_and_errors():
    config = PolicyConfig.parse(
        {
            "action": "server",
            "warning_lead": 60,
            "profiles": {"gpu-1": {"idle_timeout": 900, "action": "kernel"}},
            "exempt_users": ["root"],
            "exempt_groups": ["ops"],
            "exempt_profiles": ["mig-3g.40gb"],
        }
    )
    p = config.resolve("ann", ["physics"], "gpu-1", profile_timeout=600)
    assert (p.action, p.idle_timeout, p.warning_lead, p.exempt) == ("kernel", 900, 60, False)
    p = config.resolve("ann", [], "share-250", profile_timeout=600)
    assert (p.action, p.idle_timeout) == ("server", 600)
    assert config.resolve("root", [], None).exempt_reason == "user root is exempt"
    assert config.resolve("bob", ["ops"], None).exempt_reason == "group ops is exempt"
    assert config.resolve("bob", [], "mig-3g.40gb").exempt
    assert IdlePolicy.from_json(p.to_json()) == p
    for bad, key in [
        ({"action": "nuke"}, "idle_policy.action"),
        ({"profiles": {"x": {"idle_timeout": -1}}}, "idle_policy.profiles.x.idle_timeout"),
        ({"profiles": {"x": {"colour": 1}}}, "idle_policy.profiles.x.colour"),
        ({"exempt_users": "ann"}, "idle_policy.exempt_users"),
        ({"idle_timeout": 60, "warning_lead": 60}, "idle_policy.warning_lead"),
        ({"idle_timout": 60}, "idle_policy.idle_timout"),
    ]:
        with pytest.raises(PolicyError) as e:
            PolicyConfig.parse(bad)
        assert e.value.key == key


def test_a_profiles_short_timeout_is_warned_halfway_in_the_local_policy_too(monkeypatch):
    # the service halves the default warning lead under a profile's short timeout; the
    # extension's own fallback did not, and refused to load
    monkeypatch.setenv("GPUSLICE_IDLE_TIMEOUT", "120")  # the profile's, from the spawner
    policy = GPUSliceExtension().local_policy("ann", "share-250")
    assert (policy.idle_timeout, policy.warning_lead) == (120, 60)
    # set here by the admin, the same timeout under the same lead is a configuration error
    config = Config({"GPUSliceExtension": {"idle_timeout": 120.0}})
    with pytest.raises(ValueError, match="warning_lead"):
        GPUSliceExtension(config=config).local_policy("ann", "share-250")
