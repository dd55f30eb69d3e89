"""The hub says so when its config undid what keeps users from switching idle reclaim off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpuslice_hub.hubconfig import configure_jupyterhub
from gpuslice_spawner.spawner import GPUSliceMixin, GPUSliceSpawner
from tests.harness.logs import said_by


def spawner(config: Config) -> GPUSliceSpawner:
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    return GPUSliceSpawner(user=user, hub=hub, config=config)


@pytest.mark.parametrize("override", [False, True])
def test_a_later_disable_user_config_false_is_said_at_the_first_spawn(
    override: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: ``c.LocalProcessSpawner.disable_user_config = False`` anywhere in the
    hub's config silently let every user's ~/.jupyter switch the extension off."""
    monkeypatch.setattr(GPUSliceMixin, "_protection_checked", False)
    c = Config()
    configure_jupyterhub(c, config_file="g.py")
    if override:
        c.LocalProcessSpawner.disable_user_config = False
    s = spawner(c)
    with said_by(s.log) as messages:  # (not caplog: see tests/harness/logs.py)
        s._check_protection()
        s._check_protection()  # once a process, not once a spawn
    said = [m for m in messages if "disable_user_config" in m]
    if override:
        assert len(said) == 1 and "GPUSliceSpawner" in said[0], said
        assert "can switch idle reclaim off" in said[0]
    else:
        assert s.disable_user_config is True and said == []
