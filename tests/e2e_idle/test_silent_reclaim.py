"""Idle reclaim is not optional for the user: real hub, real single-user servers.

A user's own ``~/.jupyter`` config cannot switch the gpuslice extension off
(``configure_jupyterhub`` sets ``Spawner.disable_user_config``), and a server whose
extension does not run at all (disabled, crashed, replaced) stops reporting, so the service
itself stops it and frees the slice once its idle timeout plus ``reclaim_silent_after`` is
past.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.harness.hub import wait_for

pytestmark = pytest.mark.hub

PROFILE = "share-250"
IDLE_TIMEOUT = 3
SILENT_AFTER = 2
STARTUP = 20

# The extension is switched off for every server, the way a user's code would kill it.
EXTENSION_OFF = """
import json, os
_off = os.path.join(cfg["workdir"], "extension-off")
os.makedirs(_off, exist_ok=True)
with open(os.path.join(_off, "jupyter_server_config.json"), "w") as f:
    json.dump({"ServerApp": {"jpserver_extensions": {"gpuslice": False}}}, f)
c.Spawner.environment = {"JUPYTER_CONFIG_PATH": _off}
"""
SERVICE = f"""
c.GPUSliceService.idle_policy = {{"profiles": {{"{PROFILE}": {{"idle_timeout": {IDLE_TIMEOUT}}}}}}}
c.GPUSliceService.reclaim_silent_after = {SILENT_AFTER}
"""


def extension_loaded(hub, user: str, token: str) -> bool:
    r = requests.get(
        f"{hub.url}/user/{user}/gpuslice/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    return r.status_code == 200


def test_a_users_own_config_cannot_switch_the_extension_off(hub_factory):
    hub = hub_factory(spawner="gpuslice-simple")
    token = hub.add_user("ann")
    own = hub.workdir / "home" / "ann" / ".jupyter"
    own.mkdir(parents=True)
    off = {"ServerApp": {"jpserver_extensions": {"gpuslice": False}}}
    (own / "jupyter_server_config.json").write_text(json.dumps(off))
    r = hub.spawn("ann", {"profile": PROFILE})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann")
    try:
        assert extension_loaded(hub, "ann", token)
    finally:
        hub.hub_api("DELETE", "/users/ann/server")
        hub.wait_gone("ann")


def test_a_server_that_stops_reporting_is_reclaimed_by_the_service(hub_factory):
    hub = hub_factory(
        spawner="gpuslice-simple",
        reconcile_interval=1,
        # left alone while it starts; then silent past idle_timeout + reclaim_silent_after
        reconcile_grace=STARTUP,
        extra_hub_config=EXTENSION_OFF,
        extra_service_config=SERVICE,
    )
    token = hub.add_user("ann")
    r = hub.spawn("ann", {"profile": PROFILE})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann")
    assert not extension_loaded(hub, "ann", token)  # nothing in it watches the GPU
    [alloc] = hub.api("GET", "/api/allocations", token).json()["allocations"]
    # stopped by the service once past its start-up grace and 5 s of silence
    hub.wait_gone("ann", timeout=90)
    r = hub.api("GET", f"/api/allocations/{alloc['id']}", token)
    assert r.json()["state"] == "released"
    events = hub.api("GET", "/api/events", token).json()["events"]
    silent = [e for e in events if e["kind"] == "reclaim-silent"]
    assert len(silent) == 1 and silent[0]["allocation_id"] == alloc["id"], events
    assert "sent no usage report" in silent[0]["reason"]
    assert silent[0]["detail"]["reclaimed_gpu_hours"] == 0.0
    # it was silent for longer than its timeout and grace, by the service's own clock
    assert silent[0]["detail"]["silent_seconds"] >= STARTUP
    wait_for(lambda: hub.server_model("ann") is None, 10, "the server to stay gone")
