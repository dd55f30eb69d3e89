"""The service's REST API behind a real JupyterHub: identity, ownership, bad input, metrics."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def shared_hub(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(tmp_path_factory.mktemp("api-hub"))
    yield hub
    hub.stop()


@pytest.fixture
def clean(shared_hub):
    """Release everything between tests so each starts from an empty ledger."""
    yield shared_hub
    for a in shared_hub.api("GET", "/api/allocations", shared_hub.service_token).json()[
        "allocations"
    ]:
        shared_hub.api("DELETE", f"/api/allocations/{a['id']}", shared_hub.service_token)


def test_no_token_is_403_not_a_redirect(clean):
    for method, path in [
        ("GET", "/api/allocations"),
        ("POST", "/api/allocations"),
        ("GET", "/api/inventory"),
    ]:
        r = clean.api(method, path, allow_redirects=False)
        assert r.status_code == 403, (method, path, r.status_code)
        assert "authentication required" in r.json()["message"]
    r = clean.api("GET", "/api/allocations", token="not-a-token")
    assert r.status_code == 403


def test_users_see_and_touch_only_their_own(clean):
    ann, bob = clean.add_user("ann"), clean.add_user("bob")
    a = clean.allocate("ann", "share-250").json()
    b = clean.allocate("bob", "share-250").json()
    mine = clean.api("GET", "/api/allocations", ann).json()["allocations"]
    assert [x["id"] for x in mine] == [a["id"]]
    # another user's allocation answers as a missing one does: ids are not a side channel
    r = clean.api("GET", f"/api/allocations/{b['id']}", ann)
    assert r.status_code == 404 and "bob" not in r.text
    assert clean.api("GET", "/api/allocations?user=bob", ann).status_code == 403
    r = clean.api("DELETE", f"/api/allocations/{b['id']}", ann)
    assert r.status_code == 404 and r.json()["message"] == f"no allocation {b['id']}"
    assert clean.api("GET", f"/api/allocations/{b['id']}", bob).json()["state"] == "active"
    # a user may not allocate at all (only a spawn holds a slice): not for herself, not for
    # someone else, not with claimed groups, not as a batch job with a high priority
    for body in (
        {"profile": "share-250", "server_name": "mine"},
        {"profile": "share-250", "user": "bob"},
        {"profile": "mig-3g.40gb", "groups": ["physics"]},
        {"profile": "gpu-1", "purpose": "batch", "priority": 1000},
    ):
        r = clean.api("POST", "/api/allocations", ann, json=body)
        assert r.status_code == 403 and "start a server" in r.json()["message"], r.text
    assert [x["id"] for x in clean.api("GET", "/api/allocations", ann).json()["allocations"]] == [
        a["id"]
    ]
    # events: only ann's own
    events = clean.api("GET", "/api/events", ann).json()["events"]
    assert events and {e["user"] for e in events} == {"ann"}
    # inventory: ann sees that a slice is held, but not by whom unless it is hers
    inv = clean.api("GET", "/api/inventory", ann).json()
    holders = [h for host in inv["hosts"] for g in host["gpus"] for h in g["holders"]]
    assert {h["user"] for h in holders} == {"ann", None}
    assert inv["simulated"] is True and inv["backend"] == "simulated"


def test_admins_see_everything_and_can_release(clean):
    ann = clean.add_user("ann")
    admin = clean.add_user("admin")
    a = clean.allocate("ann", "gpu-1").json()
    all_allocs = clean.api("GET", "/api/allocations", admin).json()["allocations"]
    assert a["id"] in [x["id"] for x in all_allocs]
    r = clean.api("DELETE", f"/api/allocations/{a['id']}?reason=maintenance", admin)
    assert r.status_code == 200 and r.json()["released_now"] is True
    assert r.json()["release_reason"] == "maintenance"
    r = clean.api("DELETE", f"/api/allocations/{a['id']}", ann)
    assert r.status_code == 200 and r.json()["released_now"] is False


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"{}", 400, "'profile'"),
        (b'{"profile": "share-250", "colour": "red"}', 400, "unknown field 'colour'"),
        (b'{"profile": "share-250", "priority": "high"}', 400, "'priority'"),
        (b'{"profile": "share-250", "server_name": "a/b"}', 400, "server_name"),
        (b'{"profile": "share-250", "purpose": "mining"}', 400, "purpose"),
        (b'{"profile": "share-250", "purpose": "batch"}', 400, "purpose"),
        (b'{"profile": "share-250", "priority": {"a": 1}}', 400, "'priority'"),
        (b'{"profile": "share-250", "server_name": "\\ud800"}', 400, "not valid Unicode"),
        (b'{"profile": "share-250", "server_name": "a\\u0000"}', 400, "NUL character"),
        (b'{"profile": "share-250", "priority": NaN}', 400, "NaN"),
        (b'{"profile": "share-250", "priority": 1e400}', 400, "too large"),
        (b"[" * 50_000 + b"]" * 50_000, 400, "nested deeper"),
        (b'{"profile": "' + b"x" * (2 << 20) + b'"}', 413, "larger than"),
        (b'{"profile": "h100-everything"}', 404, "unknown profile"),
        (b'{"profile": "mig-3g.40gb"}', 403, "not allowed"),
    ],
)
def test_bad_requests_are_refused_and_write_nothing(clean, body, status, needle):
    ann = clean.add_user("ann")
    if body == b"{}":
        body = b'{"user": "ann"}'
    elif body.startswith(b"{"):
        body = body[:-1] + b', "user": "ann"}'
    r = clean.api("POST", "/api/allocations", clean.service_token, data=body)
    assert r.status_code == status, r.text[:500]
    assert needle in r.json()["message"]
    assert clean.api("GET", "/api/allocations", ann).json()["allocations"] == []
    assert clean.api("GET", "/api/allocations/123456", ann).status_code == 404
    assert clean.api("GET", "/api/allocations/99999999999999999999999", ann).status_code == 404
    assert clean.api("GET", "/api/allocations?limit=zero", ann).status_code == 400


def test_spawner_token_allocates_for_a_user_with_groups(clean):
    clean.add_user("pia", groups=("physics",))
    body = {"profile": "mig-3g.40gb", "user": "pia", "groups": ["physics"], "server_name": "gpu"}
    r = clean.api("POST", "/api/allocations", clean.service_token, body and None, json=body)
    assert r.status_code == 201, r.text
    alloc = r.json()
    assert alloc["user"] == "pia" and alloc["assignments"][0]["mig_profile"] == "3g.40gb"
    # the same request again (a retried spawn) returns the same allocation
    r2 = clean.api("POST", "/api/allocations", clean.service_token, json=body)
    assert r2.status_code == 200 and r2.json()["id"] == alloc["id"]
    # groups the spawner does not state are looked up on the hub, not taken
    r = clean.allocate("pia", "share-250", "other")
    assert r.status_code == 201 and r.json()["groups"] == ["physics"]
    assert clean.allocate("ghost", "share-250").status_code == 404
    # an admin is not the spawner: no allocations through the API either
    admin = clean.add_user("admin")
    r = clean.api("POST", "/api/allocations", admin, json={"profile": "share-250", "user": "pia"})
    assert r.status_code == 403


def test_profiles_report_live_availability(clean):
    ann = clean.add_user("ann")
    before = {p["name"]: p for p in clean.api("GET", "/api/profiles", ann).json()["profiles"]}
    assert before["mig-1g.10gb"]["free"] == before["mig-1g.10gb"]["total"] == 2
    clean.allocate("ann", "mig-1g.10gb")
    after = {p["name"]: p for p in clean.api("GET", "/api/profiles", ann).json()["profiles"]}
    assert after["mig-1g.10gb"]["free"] == 1
    assert after["mig-3g.40gb"]["available"] is False
    assert after["mig-3g.40gb"]["reason"] == "not allowed for your groups"


def test_metrics_need_the_metrics_or_admin_scope_and_count_allocations(clean):
    ann = clean.add_user("ann")
    admin = clean.add_user("admin")
    refusals = 'gpuslice_refusals_total{code="forbidden_profile",profile="mig-3g.40gb"}'
    before = metric(clean.api("GET", "/metrics", admin).text, refusals)
    clean.allocate("ann", "mig-1g.10gb")
    clean.allocate("ann", "mig-3g.40gb", "x")
    assert clean.api("GET", "/metrics", ann).status_code == 403
    # the read-only scope a Prometheus service gets: metrics, and none of the admin API
    prom = clean.config["metrics_token"]
    assert clean.api("GET", "/metrics", prom).status_code == 200
    assert clean.api("GET", "/api/admin/quotas", prom).status_code == 403
    assert clean.api("GET", "/api/allocations?user=ann", prom).status_code in (400, 403)
    r = clean.api("GET", "/metrics", admin)
    assert r.status_code == 200
    text = r.text
    assert 'gpuslice_mig_instances{host="node-a",profile="1g.10gb"} 2.0' in text
    assert 'gpuslice_mig_instances_allocated{host="node-a",profile="1g.10gb"} 1.0' in text
    assert (
        'gpuslice_allocations_active{host="node-a",profile="mig-1g.10gb",purpose="interactive"} 1.0'
        in text
    )
    assert 'gpuslice_user_allocations{user="ann"} 1.0' in text
    assert metric(text, refusals) == before + 1
    # utilization from the holder's usage report: 50 % of a 1g instance
    [held] = clean.api("GET", "/api/allocations", ann).json()["allocations"]
    report = {"utilization": 50, "memory_mib": 100, "interval_seconds": 60}
    assert clean.api("POST", f"/api/allocations/{held['id']}/usage", ann, json=report).ok
    text = clean.api("GET", "/metrics", admin).text
    milli = held["gpu_milli"]
    assert metric(text, 'gpuslice_gpu_milli_reported{host="node-a"}') == milli
    assert metric(text, 'gpuslice_gpu_milli_utilized{host="node-a"}') == round(milli / 2)
    assert metric(text, 'gpuslice_gpu_milli_fragmented{host="node-a"}') > 0  # the free 2g
    assert (
        'gpuslice_gpus{host="node-a",mig_mode="enabled",model="NVIDIA A100-SXM4-80GB"} 1.0' in text
    )
    # the service's own health: how long its event loop was held, what its passes cost
    assert metric(text, "gpuslice_event_loop_lag_seconds_count") > 0
    assert metric(text, "gpuslice_scheduler_pass_seconds_count") > 0
    # (the collection before the start's objects are frozen, at least)
    assert metric(text, 'gpuslice_gc_pause_seconds_count{generation="2"}') >= 1


def metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_admin_drains_a_gpu_and_it_takes_no_new_slices(clean):
    ann = clean.add_user("ann")
    admin = clean.add_user("admin")
    held = clean.allocate("ann", "share-250").json()
    gpu = held["assignments"][0]["gpu_uuid"]
    assert clean.api("POST", f"/api/gpus/{gpu}/drain", ann, json={}).status_code == 403
    assert clean.api("POST", "/api/gpus/GPU-nope/drain", admin, json={}).status_code == 404
    r = clean.api("POST", f"/api/gpus/{gpu}/drain", admin, json={"reason": "ECC errors"})
    assert r.status_code == 200 and r.json() == {"uuid": gpu, "drained": True, "changed": True}
    # the holder keeps its slice; new shares go elsewhere, and whole GPUs drop to one
    assert clean.api("GET", f"/api/allocations/{held['id']}", ann).json()["state"] == "active"
    for i in range(4):
        r = clean.allocate("ann", "share-250", f"d{i}")
        if r.status_code == 201:
            assert r.json()["assignments"][0]["gpu_uuid"] != gpu
    profiles = {p["name"]: p for p in clean.api("GET", "/api/profiles", admin).json()["profiles"]}
    assert profiles["gpu-1"]["total"] == 1
    # the shares took the one whole GPU left in service: the drain is named as a reason
    profiles = {p["name"]: p for p in clean.api("GET", "/api/profiles", ann).json()["profiles"]}
    assert profiles["gpu-1"]["reason"] == (
        "all in use (1 of 1 in use; 1 more on GPUs drained for maintenance)"
    )
    r = clean.allocate("ann", "gpu-1", "another")
    assert r.status_code == 409
    assert r.json()["message"].startswith(
        "No gpu-1 free (1 of 1 in use; 1 more on GPUs drained for maintenance)"
    )
    events = clean.api("GET", "/api/events", admin).json()["events"]
    assert any(e["kind"] == "gpu-drained" and e["reason"] == "ECC errors" for e in events)
    r = clean.api("POST", f"/api/gpus/{gpu}/drain", admin, json={"drained": False})
    assert r.json()["changed"] is True


def walk(hub, path: str, cursor: str, key: str, start: int | None = None) -> list[int]:
    """The ids of every page of ``path``, following ``next`` in the ``cursor`` argument."""
    ids: list[int] = []
    at = start
    while True:
        sep = "&" if "?" in path else "?"
        page = hub.api(
            "GET", path + (f"{sep}{cursor}={at}" if at is not None else ""), hub.service_token
        ).json()
        ids += [item["id"] for item in page[key]]
        if page["next"] is None:
            return ids
        at = page["next"]


def test_event_and_allocation_pages_follow_cursors_and_skip_nothing(clean):
    hub = clean
    pat = hub.add_user("pat")  # nobody else in this module: her allocations are these
    ids = []
    for i in range(7):  # 7 allocated + 7 released events, newest ids last
        a = hub.allocate("pat", "share-250", f"s{i}").json()
        ids.append(a["id"])
        hub.api("DELETE", f"/api/allocations/{a['id']}", pat)
    everything = hub.api("GET", "/api/events?limit=5000", hub.service_token).json()["events"]
    first = min(e["id"] for e in everything)

    # following the log from an id: oldest first, every event once, however many arrived
    seen = walk(hub, "/api/events?limit=3", "since", "events", start=first - 1)
    assert seen == sorted(e["id"] for e in everything)
    # newest first, page by page back
    back = walk(hub, "/api/events?limit=4", "before", "events")
    assert back == sorted((e["id"] for e in everything), reverse=True)
    r = hub.api("GET", "/api/events?since=1&before=5", hub.service_token)
    assert r.status_code == 400 and "not both" in r.json()["message"]

    shown = walk(hub, "/api/allocations?state=all&user=pat&limit=2", "before", "allocations")
    assert shown == sorted(ids, reverse=True)
    for bad in ("order=oldest", "cursor=-1", "cursor=x", "order=run&cursor=1e3"):
        r = hub.api("GET", f"/api/jobs?{bad}", pat)
        assert r.status_code == 400 and bad.split("=")[-2].split("&")[-1] in r.json()["message"]
    r = hub.api("GET", "/api/allocations?before=-5", pat)
    assert r.status_code == 400 and "before" in r.json()["message"]


def test_usage_reports_waiting_for_the_writer_never_hold_up_a_spawn_form(clean):
    """Reports have threads of their own: a burst of them waiting for SQLite's one writer
    (held here by another connection) leaves the shared threads to everyone else."""
    import sqlite3
    import threading
    import time

    ann = clean.add_user("ann")
    held = clean.allocate("ann", "share-250").json()
    report = {"utilization": 50, "memory_mib": 100, "interval_seconds": 60}
    ledger = sqlite3.connect(clean.config["db_url"].removeprefix("sqlite:///"), timeout=60)
    ledger.isolation_level = None
    statuses: list[int] = []

    def send() -> None:
        r = clean.api("POST", f"/api/allocations/{held['id']}/usage", ann, json=report)
        statuses.append(r.status_code)

    ledger.execute("BEGIN IMMEDIATE")  # the one writer, until the rollback below
    try:
        # more reports than the shared pool has threads (6 on this machine's 2 CPUs, up to 32)
        senders = [threading.Thread(target=send) for _ in range(40)]
        for t in senders:
            t.start()
        # forms one after another for 3 s: by then every report has reached the service
        # and waits (for up to SQLite's 30 s busy timeout); each form must still answer
        until = time.monotonic() + 3
        while time.monotonic() < until:
            started = time.monotonic()
            r = clean.api("GET", "/api/profiles", ann)
            waited = time.monotonic() - started
            assert r.status_code == 200, r.text
            assert statuses == [] and waited < 10, (statuses, waited)
    finally:
        ledger.execute("ROLLBACK")
        ledger.close()
    for t in senders:
        t.join(60)
    assert statuses == [200] * 40


def test_nul_in_a_url_or_a_hub_name_is_refused_on_postgresql(hub_factory, postgres_db):
    """PostgreSQL's text cannot hold a NUL: a lookup by a path part or a hub user's name
    holding one was a 500 there (found by a review), where SQLite answered."""
    hub = hub_factory(db_url=postgres_db)
    admin = hub.add_user("admin", admin=True)
    for method, path in [
        ("DELETE", "/api/admin/exemptions/a%00b"),
        ("DELETE", "/api/admin/quotas/user/a%00b"),
        ("POST", "/api/gpus/GPU-x%00y/drain"),
        ("GET", "/api/allocations?user=a%00b"),
    ]:
        r = hub.api(method, path, admin)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert r.json()["message"] == "the URL holds a NUL character (%00)"
    nul = hub.add_user("n%00ul")  # (the hub takes that name)
    r = hub.api("GET", "/api/allocations", nul)
    assert r.status_code == 403 and "holds a NUL character" in r.json()["message"]
    assert "Internal Server Error" not in hub.log() and " 500 " not in hub.log()


class Sized:
    """A request body of ``size`` bytes that is never held in memory: sent with its
    Content-Length (``chunked=False``) or in chunks with none (a client streaming it)."""

    def __init__(self, size: int, chunked: bool = False) -> None:
        self.size, self.chunked = size, chunked

    def body(self) -> Any:
        piece = b"x" * (1 << 20)
        head = b'{"notebook": "'
        chunks = [head, *([piece] * ((self.size - len(head)) >> 20))]
        chunks.append(b"x" * (self.size - sum(len(c) for c in chunks)))
        if self.chunked:
            return iter(chunks)  # (requests sends a generator chunked)
        return SizedFile(chunks, self.size)


class SizedFile:
    """A file-like body: requests reads its length from ``__len__`` and streams ``read``."""

    def __init__(self, chunks: list[bytes], size: int) -> None:
        self.chunks, self.size = list(chunks), size

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.parametrize(
    "body",
    [Sized(17 << 20), Sized(200 << 20), Sized(17 << 20, chunked=True)],
    ids=["17MiB", "200MiB", "17MiB-chunked"],
)
@pytest.mark.parametrize("via_proxy", [True, False], ids=["hub-url", "direct"])
def test_a_body_over_the_limit_is_a_413_with_a_message_through_the_hub_too(clean, body, via_proxy):
    """The service reads an oversized body to its end before it answers: closed early, the
    connection was reset under configurable-http-proxy, which then answered its own 503
    HTML page (write ECONNRESET), and a direct client got a 400 with no body."""
    ann = clean.add_user("ann")
    headers = {"Content-Type": "application/json"}
    r = clean.api("POST", "/api/jobs", ann, via_proxy, data=body.body(), headers=headers)
    assert r.status_code == 413, r.text[:300]
    message = r.json()["message"]
    # the limit, the setting that sets it, and what to do about it
    assert "larger than 16 MiB" in message and "max_notebook_bytes" in message, message
    assert "clear its outputs" in message, message
    assert clean.api("GET", "/api/jobs", ann).json()["jobs"] == []
    # a route with the ordinary limit says so too
    r = clean.api("POST", "/api/allocations", ann, via_proxy, data=Sized(2 << 20).body())
    assert r.status_code == 413 and "larger than 1 MiB" in r.json()["message"], r.text[:300]
    assert "max_body_bytes" in r.json()["message"]
