"""Idle reclaim end to end, all real processes: JupyterHub, the gpuslice service,
jupyterhub-idle-culler, and single-user servers running the gpuslice extension on the
simulated backend (a kernel's "GPU utilization" is its process tree's CPU use).

Timings are shrunk through config: 0.5 s ticks, 1 s windows, a 6 s idle timeout with a
3 s warning lead (the service's idle policy), and a 20 s timeout for the idle culler.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests
import websocket

from tests.harness.hub import wait_for

pytestmark = pytest.mark.hub

IDLE_TIMEOUT = 6
LEAD = 3
CULLER_TIMEOUT = 20
PROFILE = "share-250"
# Under this profile an idle kernel is culled and its server keeps its slice.
KERNEL_PROFILE = "mig-1g.10gb"
# The reconciler runs every half second and asks again for stops older than this.
RECONCILE_GRACE = 3

EXTRA_HUB_CONFIG = """
import json, os, sys
_ext = os.path.join(cfg["workdir"], "jupyter-config")
os.makedirs(_ext, exist_ok=True)
with open(os.path.join(_ext, "jupyter_server_config.json"), "w") as f:
    json.dump({"GPUSliceExtension": {"sample_interval": 0.5, "idle_window": 1,
               "policy_refresh_interval": 3600, "usage_report_interval": 1}}, f)
c.Spawner.environment = {"JUPYTER_CONFIG_PATH": _ext, "JUPYTERHUB_ACTIVITY_INTERVAL": "1"}
c.JupyterHub.services = c.JupyterHub.services + [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                "--timeout=CULLER_TIMEOUT", "--cull-every=2"],
}]
c.JupyterHub.load_roles = c.JupyterHub.load_roles + [{
    "name": "idle-culler", "services": ["idle-culler"],
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
}]
c.JupyterHub.last_activity_interval = 1
""".replace("CULLER_TIMEOUT", str(CULLER_TIMEOUT))

SERVICE_POLICY = f"""
c.GPUSliceService.idle_policy = {{
    "action": "server",
    "warning_lead": {LEAD},
    "profiles": {{
        "{PROFILE}": {{"idle_timeout": {IDLE_TIMEOUT}, "max_extension": 30}},
        "{KERNEL_PROFILE}": {{"action": "kernel", "idle_timeout": {IDLE_TIMEOUT}}},
    }},
    # fay's server answers the release test's checks: on a loaded machine they outlast
    # the 6 s idle timeout, and her kernel-less server would be culled before "release"
    "exempt_users": ["dan", "fay"],
}}
"""


@pytest.fixture(scope="module")
def idle_hub(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(
        tmp_path_factory.mktemp("idle-hub"),
        spawner="gpuslice-simple",
        extra_hub_config=EXTRA_HUB_CONFIG,
        extra_service_config=SERVICE_POLICY,
        reconcile_interval=0.5,
        reconcile_grace=RECONCILE_GRACE,
    )
    yield hub
    hub.stop()


class Session:
    """One user's server, reached through the hub's proxy with the user's token."""

    def __init__(self, hub, user: str, profile: str = PROFILE) -> None:
        self.hub = hub
        self.user = user
        self.token = hub.add_user(user)
        r = hub.spawn(user, {"profile": profile})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(user)
        self.base = f"{hub.url}/user/{user}/"

    def call(self, method: str, path: str, **kw) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, self.base + path, headers=headers, timeout=30, **kw)

    def status(self) -> dict:
        r = self.call("GET", "gpuslice/api/status")
        assert r.status_code == 200, r.text
        return r.json()

    def start_kernel(self) -> str:
        r = self.call("POST", "api/kernels", json={"name": "python3"})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def ws(self, path: str) -> websocket.WebSocket:
        url = self.base.replace("http://", "ws://") + path
        return websocket.create_connection(url, header=[f"Authorization: token {self.token}"])

    def execute(self, kernel_id: str, code: str) -> None:
        """Send an execute request and leave it running (no output is produced)."""
        ws = self.ws(f"api/kernels/{kernel_id}/channels")
        msg_id = uuid.uuid4().hex
        ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": self.user,
                        "session": uuid.uuid4().hex,
                        "msg_type": "execute_request",
                        "version": "5.3",
                        "date": datetime.now(UTC).isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                    },
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        # Wait until the kernel says it is busy with our request, then let it run.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = json.loads(ws.recv())
            if (
                m.get("msg_type") == "status"
                and m["parent_header"].get("msg_id") == msg_id
                and m["content"]["execution_state"] == "busy"
            ):
                break
        ws.close()

    def subscribe(self) -> list[dict]:
        """Collect the server's jupyter events (what JupyterLab receives) in the background."""
        received: list[dict] = []
        ws = self.ws("api/events/subscribe")

        def read() -> None:
            try:
                while True:
                    received.append(json.loads(ws.recv()))
            except Exception:
                pass

        threading.Thread(target=read, daemon=True).start()
        return received


def idle_events(hub, user: str) -> list[dict]:
    r = hub.api("GET", f"/api/events?user={user}", hub.service_token)
    assert r.status_code == 200, r.text
    return [e for e in reversed(r.json()["events"]) if e["kind"].startswith("idle-")]


def at(event: dict) -> float:
    """When the service recorded ``event`` (epoch seconds)."""
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def deadline_of(warning: dict) -> datetime:
    """The deadline an idle warning announced."""
    return datetime.fromisoformat(warning["detail"]["deadline"].replace("Z", "+00:00"))


def active_allocations(hub, user: str) -> list[dict]:
    r = hub.api("GET", f"/api/allocations?user={user}", hub.service_token)
    return r.json()["allocations"]


def ours(received: list[dict]) -> list[dict]:
    return [e for e in received if e.get("schema_id") == "https://events.gpuslice.dev/idle/v1"]


def admin_holder(hub, token: str, alloc_id: int) -> dict | None:
    overview = hub.api("GET", "/api/admin/overview", token).json()
    for host in overview["hosts"]:
        for gpu in host["gpus"]:
            for piece in gpu["slices"]:
                if piece["holder"] and piece["holder"]["allocation_id"] == alloc_id:
                    return dict(piece["holder"])
    return None


def test_idle_kernel_is_warned_then_its_server_culled_and_the_slice_freed(idle_hub):
    hub = idle_hub
    ann = Session(hub, "ann")
    assert len(active_allocations(hub, "ann")) == 1
    events = ann.subscribe()
    kid = ann.start_kernel()
    status = ann.status()
    assert status["policy"] == {
        "action": "server",
        "idle_timeout": IDLE_TIMEOUT,
        "warning_lead": LEAD,
        "max_extension": 30,
        "source": "service",
    }
    assert status["slice"]["simulated"] is True and status["slice"]["profile"] == PROFILE
    assert [k["id"] for k in status["kernels"]] == [kid]

    warning = wait_for(
        lambda: [e for e in ours(events) if e["action"] == "warning"], 60, "the idle warning"
    )[0]
    warned_at = time.time()
    assert warning["kernel_id"] is None  # server mode: the whole server is at stake
    deadline = datetime.fromisoformat(warning["deadline"].replace("Z", "+00:00")).timestamp()
    # The exact lead is tested with a test clock (tests/extension); here, with real time
    # and a loaded machine, the warning must arrive before the deadline it announces.
    assert deadline > warned_at
    held = active_allocations(hub, "ann")
    hub.wait_gone("ann", timeout=60)
    gone_at = time.time()
    assert gone_at >= deadline - 0.5
    assert active_allocations(hub, "ann") == []
    # the release says it was an idle cull (the spawner only knows its server stopped)
    released = hub.api("GET", f"/api/allocations/{held[0]['id']}", hub.service_token).json()
    assert released["release_reason"].startswith("culled for idleness: "), released
    # Who comes back reads why on the hub's "Server not running" page.
    page = requests.get(
        f"{hub.url}/hub/user/ann/", headers={"Authorization": f"token {ann.token}"}, timeout=30
    )
    assert page.status_code == 424, page.text[:500]
    notice = re.search(r'<p id="gpuslice-stopped"[^>]*>\s*(.*?)\s*</p>', page.text, re.S)
    assert notice, page.text
    assert "gpuslice stopped this server on " in notice.group(1)
    assert "culled for idleness: GPU idle for" in notice.group(1)
    assert "Server not running" in page.text  # the hub's own page, with its launch button
    # and on the hub's home page, where a person starts servers from
    home = hub.logged_in("ann").get(f"{hub.url}/hub/home", timeout=30)
    assert home.status_code == 200, home.text[:500]
    said = re.findall(
        r'<p class="alert alert-info gpuslice-stopped"[^>]*>\s*(.*?)\s*</p>', home.text, re.S
    )
    assert len(said) == 1 and "culled for idleness: GPU idle for" in said[0], home.text
    assert 'id="start"' in home.text  # the hub's own page, with its start button
    # A new start forgets it, and a stop that was not gpuslice's says nothing of the kind.
    assert hub.spawn("ann", {"profile": PROFILE}).status_code in (201, 202)
    hub.wait_ready("ann")
    stopped = hub.hub_api("DELETE", "/users/ann/server")
    assert stopped.status_code in (202, 204), stopped.text
    hub.wait_gone("ann")
    page = requests.get(
        f"{hub.url}/hub/user/ann/", headers={"Authorization": f"token {ann.token}"}, timeout=30
    )
    assert page.status_code == 424 and 'id="gpuslice-stopped"' not in page.text, page.text
    home = hub.logged_in("ann").get(f"{hub.url}/hub/home", timeout=30)
    assert home.status_code == 200 and "gpuslice-stopped" not in home.text, home.text
    recorded = idle_events(hub, "ann")
    # The server is warned its idle timeout less the lead after it starts. On a loaded
    # machine the spawn can take that long before this test starts its kernel: that start
    # is activity, so a new idle run begins, warned about again (and the earlier run's
    # report can reach the service after the kernel started). Warnings of earlier runs
    # only, each with an earlier deadline; then exactly one warning and the cull.
    *earlier, last_warning, culled = recorded
    assert (last_warning["kind"], culled["kind"]) == ("idle-warning", "idle-culled"), recorded
    assert "GPU idle" in culled["reason"]
    final = last_warning["detail"]["deadline"]
    assert all(e["kind"] == "idle-warning" and e["detail"]["deadline"] < final for e in earlier), (
        recorded
    )
    culled = idle_events(hub, "ann")[-1]
    assert culled["detail"]["reclaimed_gpu_hours"] > 0
    metrics = hub.api("GET", "/metrics", hub.add_user("admin")).text
    assert f'gpuslice_idle_culls_total{{profile="{PROFILE}",scope="server"}} 1.0' in metrics
    hours = re.search(rf'gpuslice_reclaimed_gpu_hours_total{{profile="{PROFILE}"}} (\S+)', metrics)
    assert hours and float(hours.group(1)) == pytest.approx(culled["detail"]["reclaimed_gpu_hours"])


def test_keepalive_postpones_the_cull(idle_hub):
    hub = idle_hub
    cat = Session(hub, "cat")
    kid = cat.start_kernel()
    first = wait_for(
        lambda: (s := cat.status())["kernels"] and s["kernels"][0]["warning"] and s,
        60,
        "the idle warning",
    )
    old = datetime.fromisoformat(first["kernels"][0]["deadline"].replace("Z", "+00:00"))
    r = cat.call("POST", "gpuslice/api/keepalive", json={"seconds": 10})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["extension_left_seconds"] == 20
    [k] = reply["kernels"]
    new = datetime.fromisoformat(k["deadline"].replace("Z", "+00:00"))
    assert k["id"] == kid and (new - old).total_seconds() >= 10
    r = cat.call("POST", "gpuslice/api/keepalive", json={"seconds": 21})
    assert r.status_code == 400 and "at most 20 s" in r.json()["message"]
    # Still there after the old deadline ...
    while time.time() < old.timestamp() + 3:
        assert cat.status()["kernels"][0]["id"] == kid
        time.sleep(0.5)
    # ... and culled only once the new one has passed.
    hub.wait_gone("cat", timeout=60)
    assert time.time() >= new.timestamp() - 0.5
    recorded = idle_events(hub, "cat")
    kinds = [e["kind"] for e in recorded]
    # Warned, kept alive, warned before the promised deadline, culled: once each (an
    # idle kernel's CPU housekeeping once read as use and warned the server again).
    extended = kinds.index("idle-extended")
    assert kinds[extended - 1 :] == [
        "idle-warning",
        "idle-extended",
        "idle-warning",
        "idle-culled",
    ], recorded
    # Before that, only warnings of earlier idle runs (see the test above), each with an
    # earlier deadline than the warning kept alive. That one may be of the run before the
    # kernel started too: a kernel whose start no tick saw as use leaves the server's idle
    # run, and its warning, as they were.
    kept = deadline_of(recorded[extended - 1])
    assert all(
        e["kind"] == "idle-warning" and deadline_of(e) < kept for e in recorded[: extended - 1]
    ), recorded
    assert active_allocations(hub, "cat") == []


def test_busy_silent_kernel_is_never_culled_and_the_idle_culler_leaves_it(idle_hub):
    hub = idle_hub
    bob = Session(hub, "bob")  # trains silently on the (simulated) GPU
    kid = bob.start_kernel()
    bob.execute(kid, "while True:\n    pass\n")
    busy_since = time.time()
    dan = Session(hub, "dan")  # exempt from gpuslice: only the idle culler can stop it
    assert dan.status()["exempt"] is True
    dan.start_kernel()
    started = time.time()
    try:
        # The control: the idle culler does cull an idle server.
        hub.wait_gone("dan", timeout=CULLER_TIMEOUT + 60)
        assert time.time() - started >= CULLER_TIMEOUT - 5
        # Meanwhile the silent, busy one is still there, with its kernel still running.
        model = hub.server_model("bob")
        assert model is not None and model["ready"]
        [k] = bob.status()["kernels"]
        assert k["id"] == kid and k["execution_state"] == "busy"
        # above the idle threshold (how far above depends on what else the CPUs run)
        assert k["utilization"] >= 1 and k["deadline"] is None and not k["warning"]
        last = datetime.fromisoformat(model["last_activity"].replace("Z", "+00:00"))
        assert time.time() - last.timestamp() < CULLER_TIMEOUT / 2
        # Nothing since the loop started (a server with no kernel yet may be warned).
        since = [
            e
            for e in idle_events(hub, "bob")
            if datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp() > busy_since
        ]
        assert since == []
        assert "idle-culled" not in [e["kind"] for e in idle_events(hub, "bob")]
        [alloc] = active_allocations(hub, "bob")
        # The server's usage reports reach the admin panel: bob's slice is busy, not idle.
        admin = hub.add_user("admin")
        holder = wait_for(
            lambda: (h := admin_holder(hub, admin, alloc["id"])) and h["reported_at"] and h,
            timeout=30,
            what="a usage report of bob's server in the admin overview",
        )
        assert holder["utilization"] >= 1 and holder["idle_seconds"] == 0, holder
    finally:
        hub.hub_api("DELETE", "/users/bob/server")
        hub.wait_gone("bob")


def test_release_button_and_the_services_checks(idle_hub):
    hub = idle_hub
    fay = Session(hub, "fay")
    [alloc] = active_allocations(hub, "fay")
    stranger = hub.add_user("gus")
    reclaim = f"/api/allocations/{alloc['id']}/reclaim"
    # Only the holder may reclaim a slice: not an admin, not the service token (403), and
    # another user is told nothing (404); only the owner or an admin may read its policy.
    admin = hub.add_user("admin")
    r = hub.api("POST", reclaim, stranger, json={"reason": "mine now", "idle_seconds": 1e6})
    assert r.status_code == 404 and "fay" not in r.text
    for token in (admin, hub.service_token):
        r = hub.api("POST", reclaim, token, json={"reason": "mine now", "idle_seconds": 1e6})
        assert r.status_code == 403 and "only the holder" in r.json()["message"], r.text
    r = hub.api("GET", f"/api/idle-policy?allocation_id={alloc['id']}", stranger)
    assert r.status_code == 404  # as if it did not exist: ids are not a side channel
    assert hub.api("POST", "/api/allocations/99999/reclaim", fay.token, json={}).status_code == 404
    for body in ({"reason": ""}, {"idle_seconds": -1}, {"voluntary": "yes"}, {"why": "x"}):
        r = hub.api("POST", reclaim, fay.token, json=body)
        assert r.status_code == 400, (body, r.text)
    r = hub.api("GET", "/api/idle-policy", stranger)
    assert r.status_code == 200 and r.json()["policy"]["action"] == "server"
    r = hub.api("GET", "/api/idle-policy?allocation_id=dan", stranger)
    assert r.status_code == 400
    # "Save and release GPU": the server stops and the slice is free, recorded as asked.
    r = fay.call("POST", "gpuslice/api/release", json={})
    assert r.status_code == 202, r.text
    hub.wait_gone("fay", timeout=60)
    assert active_allocations(hub, "fay") == []
    released = hub.api("GET", f"/api/allocations/{alloc['id']}", hub.service_token).json()
    assert released["release_reason"].startswith("released by its owner"), released
    r = hub.api("GET", "/api/events?user=fay", hub.service_token)
    kinds = [e["kind"] for e in r.json()["events"]]
    assert "release-requested" in kinds and "idle-culled" not in kinds
    r = hub.api("POST", reclaim, fay.token, json={"reason": "again"})
    assert r.status_code == 409


def reconciled_at(hub) -> float:
    """When the service last completed a reconciliation (0 before the first)."""
    stamp = hub.api("GET", "/api/health").json()["reconciled"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def test_culling_idle_kernels_keeps_the_server_and_its_slice(idle_hub):
    """Issue 44: under ``action: kernel`` two idle kernels were culled on time, and a few
    reconcile passes later the reconciler took each kernel's cull for a server stop that had
    not happened, stopped the whole server and gave its slice away."""
    hub = idle_hub
    kim = Session(hub, "kim", KERNEL_PROFILE)
    [alloc] = active_allocations(hub, "kim")
    assert kim.status()["policy"]["action"] == "kernel"
    kernels = {kim.start_kernel(), kim.start_kernel()}
    wait_for(lambda: not kim.status()["kernels"], 60, "both idle kernels to be culled")
    culls = wait_for(
        lambda: (
            len(c := [e for e in idle_events(hub, "kim") if e["kind"] == "idle-culled"]) == 2 and c
        ),
        30,
        "both culls recorded",
    )
    assert {e["detail"]["kernel_id"] for e in culls} == kernels
    assert {e["detail"]["scope"] for e in culls} == {"kernel"}
    # Several reconcile passes after the culls are older than the grace: each would have
    # asked the hub to stop the server.
    judged = max(at(e) for e in culls) + RECONCILE_GRACE + 2
    wait_for(lambda: reconciled_at(hub) > judged, 30, "reconcile passes past the grace")
    model = hub.server_model("kim")
    assert model is not None and model["ready"], model
    assert [a["id"] for a in active_allocations(hub, "kim")] == [alloc["id"]]
    assert kim.status()["slice"]["profile"] == KERNEL_PROFILE  # the server still answers
    assert "asking the hub again to stop kim's server" not in hub.log()
    # A kernel's cull gives no slice back: nothing is counted as reclaimed.
    metrics = hub.api("GET", "/metrics", hub.add_user("admin")).text
    assert f'gpuslice_reclaimed_gpu_hours_total{{profile="{KERNEL_PROFILE}"}}' not in metrics
    # Only a server's own stop ends it, and its release does not blame a kernel's cull.
    stopped = hub.hub_api("DELETE", "/users/kim/server")
    assert stopped.status_code in (202, 204), stopped.text
    hub.wait_gone("kim")
    released = hub.api("GET", f"/api/allocations/{alloc['id']}", hub.service_token).json()
    assert not released["release_reason"].startswith("culled for idleness"), released


def test_an_idle_culled_event_cannot_ask_for_a_server_stop(idle_hub):
    """A server's cull is asked of the reclaim endpoint; an event saying one happened would
    read, to the reconciler, as a stop to carry out (and to count once) — refused."""
    hub = idle_hub
    lou = Session(hub, "lou", KERNEL_PROFILE)
    [alloc] = active_allocations(hub, "lou")
    try:
        for detail in ({}, {"scope": "server"}):
            body = {"kind": "idle-culled", "detail": {"allocation_id": alloc["id"], **detail}}
            r = hub.api("POST", "/api/events", lou.token, json=body)
            assert r.status_code == 400 and "reclaim" in r.json()["message"], r.text
        kernel = {"allocation_id": alloc["id"], "kernel_id": "k-1"}
        r = hub.api(
            "POST", "/api/events", lou.token, json={"kind": "idle-culled", "detail": kernel}
        )
        assert r.status_code == 201 and r.json()["detail"]["scope"] == "kernel", r.text
        assert "idle-culled" in [e["kind"] for e in idle_events(hub, "lou")]
    finally:
        hub.hub_api("DELETE", "/users/lou/server")
        hub.wait_gone("lou")
