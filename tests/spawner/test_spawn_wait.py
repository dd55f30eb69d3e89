"""How long a spawn waits for a preempted batch job, against JupyterHub's start_timeout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuslice_spawner import GPUSliceSimpleSpawner


def spawner(**traits: Any) -> GPUSliceSimpleSpawner:
    user = SimpleNamespace(name="nobody-here-xyz", id=3, url="/user/x/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    return GPUSliceSimpleSpawner(user=user, hub=hub, **traits)


def test_the_default_start_timeout_leaves_room_for_the_whole_wait():
    # JupyterHub's own default (60 s) would end the spawn during a job's grace period.
    s = spawner()
    assert s.start_timeout == s.preempt_wait_timeout + s.server_start_margin == 360
    assert s.preempt_wait() == 300


def test_a_shorter_start_timeout_caps_the_wait():
    assert spawner(start_timeout=100).preempt_wait() == 40
    assert spawner(start_timeout=30).preempt_wait() == 0  # no time to wait at all
    assert spawner(start_timeout=900, preempt_wait_timeout=120).preempt_wait() == 120
