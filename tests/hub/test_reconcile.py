"""The reconciler against a real JupyterHub: the hub is the truth about which servers exist.

A slice is given back only when the hub says its server is gone, read to the end of the hub's
own pages; and after a hub restart the slices of the servers it stopped come back in seconds.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from datetime import datetime

from tests.harness.hub import start_hub, wait_for

USERS = ("ann", "bob", "cat")
ONE_GPU = {
    "name": "node-a",
    "cpu_milli": 8000,
    "memory_mib": 64000,
    "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}],
}


def reconciled_at(hub) -> float:
    """When the service last completed a reconciliation (0 before the first)."""
    stamp = hub.api("GET", "/api/health").json()["reconciled"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def active_allocations(hub) -> dict[str, dict]:
    listed = hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"]
    return {a["user"]: a for a in listed}


# dan's server listens only once the test opens its gate: until then the hub lists it as
# starting (pending "spawn"), for as long as Spawner.http_timeout (60 s) allows
GATED = """
c.JupyterHub.api_page_max_limit = 1
c.Spawner.cmd = [
    "sh", "-c",
    'if [ "$JUPYTERHUB_USER" = dan ]; then while [ ! -e "$0" ]; do sleep 0.1; done; fi; '
    'exec "$@"',
    cfg["workdir"] + "/dan.gate", sys.executable, "-m", "jupyterhub.singleuser",
]
"""


def test_servers_on_later_pages_of_the_hub_keep_their_slices(hub_factory):
    # The hub cuts its user list into pages of one: every server but the first is on a
    # later page, and a reconciler that stops at the first page gives their slices away.
    hub = hub_factory(
        spawner="gpuslice-simple",
        reconcile_interval=0.5,
        reconcile_grace=1,
        extra_hub_config=GATED,
    )
    for user in USERS:
        hub.add_user(user)
        r = hub.spawn(user, {"profile": "share-250"})
        assert r.status_code in (201, 202), r.text
    for user in USERS:
        hub.wait_ready(user)
    held = active_allocations(hub)
    assert set(held) == set(USERS)
    # the service asked the hub what its token may do, and has all it needs (issue 45: a
    # config that dropped its role is said at start, see tests/service/test_selfcheck.py)
    wait_for(
        lambda: "the hub gives this service's token every scope it needs" in hub.log(),
        30,
        "the service's check of its own scopes",
    )
    assert "gives this service's token no" not in hub.log()
    # every allocation is past the 1 s grace from here on: wait for passes that judged them
    since = time.time() + 1.5
    wait_for(lambda: reconciled_at(hub) > since, 30, "two reconciliations after the grace")
    assert {u: a["id"] for u, a in active_allocations(hub).items()} == {
        u: a["id"] for u, a in held.items()
    }
    events = hub.api("GET", "/api/events", hub.service_token).json()["events"]
    assert not [e for e in events if e["actor"] == "reconciler"]

    # A server still starting (the hub lists it pending "spawn") keeps its slice past the
    # grace: the hub knows it, it is not stopped.
    hub.add_user("dan")
    assert hub.spawn("dan", {"profile": "share-250"}).status_code == 202
    wait_for(lambda: "dan" in active_allocations(hub), 30, "dan's slice")
    since = time.time() + 1.5
    wait_for(lambda: reconciled_at(hub) > since, 30, "two reconciliations after the grace")
    assert (hub.server_model("dan") or {}).get("pending") == "spawn"
    assert "dan" in active_allocations(hub)
    (hub.workdir / "dan.gate").touch()
    hub.wait_ready("dan")
    assert "dan" in active_allocations(hub)

    # and a server that does stop is still noticed on whichever page it was
    hub.hub_api("DELETE", "/users/cat/server")
    hub.wait_gone("cat")
    wait_for(lambda: "cat" not in active_allocations(hub), 30, "cat's slice to be released")
    assert set(active_allocations(hub)) == {"ann", "bob", "dan"}


def test_after_a_clean_hub_restart_the_slices_of_stopped_servers_are_free_in_seconds(
    tmp_path,
):
    # One GPU: while a stale allocation stands, nobody can have it whole.
    # The default interval (60 s): the pass that frees them must be the one at startup.
    # The default grace (120 s): the hub says the servers are stopped, and that is enough
    # whatever their slices' age (it kept 45 servers' slices 61 s after a restart, issue 46).
    hub = start_hub(
        tmp_path / "hub",
        spawner="gpuslice-simple",
        hosts=[ONE_GPU],
        profiles=[
            {"name": "gpu-1", "kind": "gpu", "count": 1},
            {"name": "share-250", "kind": "share", "gpu_milli": 250},
        ],
        reconcile_interval=60,
    )
    assert hub.config["reconcile_grace"] == 120
    try:
        for user in ("ann", "cat"):
            hub.add_user(user)
            assert hub.spawn(user, {"profile": "share-250"}).status_code in (201, 202)
        for user in ("ann", "cat"):
            hub.wait_ready(user)
        held = [a["id"] for a in active_allocations(hub).values()]
        assert len(held) == 2

        # A clean stop of the hub alone: it stops its services first, then the servers,
        # whose spawners can no longer tell the service that their slices are free.
        os.kill(hub.proc.pid, signal.SIGTERM)
        hub.proc.wait(60)
        db = sqlite3.connect(hub.config["db_url"].removeprefix("sqlite:///"))
        marks = ",".join("?" * len(held))
        rows = db.execute(f"SELECT active FROM allocations WHERE id IN ({marks})", held)
        assert all(active for (active,) in rows.fetchall()), "released on the hub's way down"
        db.close()
        # the hub's log says what becomes of it, not only that the release failed
        log = hub.log()
        assert "frees it itself when its reconciler next finds the server gone" in log, log[-3000:]

        hub = start_hub(tmp_path / "hub", reuse=hub.config)  # returns once the service is up
        back = time.monotonic()
        wait_for(
            lambda: not active_allocations(hub),
            30,
            "the slices of the servers the hub stopped to be free",
        )
        print(f"slices free {time.monotonic() - back:.1f} s after the service was back")
        hub.add_user("bob")
        r = hub.allocate("bob", "gpu-1")
        assert r.status_code in (200, 201), r.text
        released = hub.api("GET", f"/api/allocations/{held[0]}", hub.service_token).json()
        assert released["release_reason"] == "server stopped on the hub", released
    finally:
        hub.stop()


def test_a_cull_recorded_by_a_service_that_died_before_asking_the_hub_is_carried_out(
    hub_factory,
):
    """Found by a crash attack: the service records a cull (the person's lab is told), then
    asks the hub to stop the server. Killed in between, it left the server running on its
    slice, and nothing ever stopped it. The restarted service asks the hub again once the
    request is ``reconcile_grace`` old, and the spawner's release says it was a cull."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from gpuslice_hub.db.models import EventRow

    hub = hub_factory(spawner="gpuslice-simple", reconcile_interval=0.5, reconcile_grace=3)
    hub.add_user("ann")
    assert hub.spawn("ann", {"profile": "share-250"}).status_code in (201, 202)
    hub.wait_ready("ann")
    (alloc,) = active_allocations(hub).values()
    # what the killed service committed: the cull's record, and nothing after it
    engine = create_engine(f"sqlite:///{hub.workdir}/gpuslice.sqlite")
    with Session(engine) as s, s.begin():
        s.add(
            EventRow(
                kind="idle-culled",
                user="ann",
                actor="ann",
                allocation_id=alloc["id"],
                profile=alloc["profile"],
                reason="GPU idle for 50 s, past its 50 s timeout",
                detail={"allocation_id": alloc["id"], "reclaimed_gpu_hours": 0.001},
            )
        )
    engine.dispose()
    hub.wait_gone("ann", timeout=60)
    released = wait_for(
        lambda: (
            (a := hub.api("GET", f"/api/allocations/{alloc['id']}", hub.service_token).json())
            and a["state"] == "released"
            and a
        ),
        30,
        "ann's slice released",
    )
    assert released["release_reason"] == (
        "culled for idleness: GPU idle for 50 s, past its 50 s timeout"
    ), released
    assert "asking the hub again to stop ann's server" in hub.log()
