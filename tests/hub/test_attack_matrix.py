"""Every documented operation, attacked: an authorization matrix built from docs/openapi.yaml,
hostile bodies and path ids for every write, and the admin read side still healthy afterwards.

One hub serves the whole module. Each operation is called as six identities -- anonymous (no
token: also what a running batch job has, its environment holds no token), the owner "ann",
ann's server token, another user "bob", the gpuslice admin "admin", and the service's own token
(the hub-side spawner's) -- and each outcome is checked against ``TABLE``, which must name every
operation of the spec. Refused writes must write nothing (the ledger, events, quotas,
exemptions, jobs, drains and usage reports are read as admin before and after); no response
to a user may carry another user's data; bad input is a 4xx with a JSON message, never a 5xx.
"""

from __future__ import annotations

import ast
import hashlib
import http.cookiejar
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuslice_hub.app import GPUSliceService
from tests.harness.hub import SIM_PROFILES, Hub, wait_for
from tests.hub.attack import (
    big_body,
    body_schema,
    deep_array,
    error_problems,
    fields,
    leaks,
    many_keys,
    names_in_text,
    patched,
    strict_json,
    with_raw,
    wrong_types,
)

pytestmark = pytest.mark.hub

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
PREFIX = SPEC["servers"][0]["url"].rstrip("/")
METHODS = ("get", "post", "put", "patch", "delete")
OPS: list[tuple[str, str]] = [
    (m.upper(), p) for p, item in SPEC["paths"].items() for m in item if m in METHODS
]

# One MIG GPU and six whole ones: room for every slice the matrix takes.
HOSTS = [
    {
        "name": "node-a",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 6},
        ],
    }
]

# -- who may do what ---------------------------------------------------------------------

IDENTITIES = ("anon", "ann", "ann_server", "bob", "admin", "service")
A = "allowed"  # 2xx (or one of the operation's business 4xx), never 401/403
D = "denied"  # 403, or 404 as for an id that does not exist
H = "hidden"  # 404: the resource is not even admitted to exist
LOGIN = "login"  # a page: redirected to the hub's login

# The service's own token is trusted to allocate for users and to state their groups, and it
# reads everything and releases allocations for the spawner; it is *not* a gpuslice admin: the
# admin endpoints, the admin page, preemption, cancelling jobs and /metrics need the admin
# scope (or, for /metrics, the metrics scope), which the service's role does not carry.
SERVICE_IS_GPUSLICE_ADMIN = False


def who(*allowed: str, hidden: tuple[str, ...] = (), anon: str = D) -> dict[str, str]:
    out = dict.fromkeys(IDENTITIES, D)
    out["anon"] = anon
    out.update(dict.fromkeys(allowed, A))
    out.update(dict.fromkeys(hidden, H))
    return out


SIGNED_IN = who("ann", "ann_server", "bob", "admin", "service")
PUBLIC = who("ann", "ann_server", "bob", "admin", "service", anon=A)
PAGE = who("ann", "ann_server", "bob", "admin", "service", anon=LOGIN)
# Listing, showing, releasing: the owner (any of their tokens) or an admin; the service's
# token lists and releases for the spawner (and the test harness relies on that).
# Another user is answered as for an id that does not exist: ids are not a side channel.
OWNER_OR_ADMIN = who("ann", "ann_server", "admin", "service", hidden=("bob",))
JOB_OWNER_OR_ADMIN = who("ann", "ann_server", "admin", "service", hidden=("bob",))
# Reports about an allocation: its holder only (the owner or the owner's server), never an
# admin, another user or the service.
HOLDER = who("ann", "ann_server")
ADMIN_SCOPE = who("admin", *(("service",) if SERVICE_IS_GPUSLICE_ADMIN else ()))
ADMIN_PAGE = {**ADMIN_SCOPE, "anon": LOGIN}

# (method, spec path) -> (who, statuses besides 2xx that an allowed caller may get).
TABLE: dict[tuple[str, str], tuple[dict[str, str], frozenset[int]]] = {
    ("GET", "/"): (PAGE, frozenset()),
    ("GET", "/oauth_callback"): (PUBLIC, frozenset({400})),  # no OAuth code: always 400
    ("GET", "/api/health"): (PUBLIC, frozenset()),
    ("GET", "/api/inventory"): (SIGNED_IN, frozenset()),
    ("GET", "/api/profiles"): (SIGNED_IN, frozenset()),
    ("GET", "/api/allocations"): (SIGNED_IN, frozenset()),
    ("POST", "/api/allocations"): (who("service"), frozenset()),
    ("GET", "/api/allocations/{allocation_id}"): (OWNER_OR_ADMIN, frozenset()),
    ("DELETE", "/api/allocations/{allocation_id}"): (OWNER_OR_ADMIN, frozenset()),
    ("POST", "/api/allocations/{allocation_id}/reclaim"): (HOLDER, frozenset()),
    ("GET", "/api/idle-policy"): (OWNER_OR_ADMIN, frozenset()),  # ?allocation_id=ann's
    ("GET", "/api/events"): (SIGNED_IN, frozenset()),
    ("POST", "/api/events"): (HOLDER, frozenset()),
    ("POST", "/api/gpus/{gpu_uuid}/drain"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/admin"): (ADMIN_PAGE, frozenset()),
    ("POST", "/api/allocations/{allocation_id}/usage"): (HOLDER, frozenset()),
    ("GET", "/api/admin/quotas"): (ADMIN_SCOPE, frozenset()),
    ("PUT", "/api/admin/quotas/{subject}/{name}"): (ADMIN_SCOPE, frozenset()),
    ("DELETE", "/api/admin/quotas/{subject}/{name}"): (ADMIN_SCOPE, frozenset()),
    ("PUT", "/api/admin/quotas/default_user"): (ADMIN_SCOPE, frozenset()),
    ("DELETE", "/api/admin/quotas/default_user"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/exemptions"): (ADMIN_SCOPE, frozenset()),
    ("PUT", "/api/admin/exemptions/{user}"): (ADMIN_SCOPE, frozenset()),
    ("DELETE", "/api/admin/exemptions/{user}"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/actions"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/jobs"): (SIGNED_IN, frozenset()),
    # "user": "ann" in the body: only ann herself may submit ann's job
    ("POST", "/api/jobs"): (who("ann", "ann_server"), frozenset()),
    ("GET", "/api/jobs/{job_id}"): (JOB_OWNER_OR_ADMIN, frozenset()),
    ("DELETE", "/api/jobs/{job_id}"): (
        who("ann", "ann_server", "admin", hidden=("bob",)),
        frozenset(),
    ),
    ("GET", "/api/jobs/{job_id}/log"): (JOB_OWNER_OR_ADMIN, frozenset()),
    # a queued job has no output yet: 404 with that reason (not "no job")
    ("GET", "/api/jobs/{job_id}/output"): (JOB_OWNER_OR_ADMIN, frozenset({404})),
    # ann's job is queued: an admin's preemption is refused as "not running" (409)
    ("POST", "/api/jobs/{job_id}/preempt"): (ADMIN_SCOPE, frozenset({409})),
    # the owner's (server's) word that it copied the outputs; ann's job is queued: 409
    ("POST", "/api/jobs/{job_id}/collected"): (
        who("ann", "ann_server", hidden=("bob",)),
        frozenset({409}),
    ),
    ("GET", "/api/admin/overview"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/usage"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/capacity"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/pools"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/overcommit"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/api/admin/quota-suggestions"): (ADMIN_SCOPE, frozenset()),
    ("GET", "/metrics"): (ADMIN_SCOPE, frozenset()),
}

# Handlers that read a body the spec does not document (none left: the test keeps it so).
UNDOCUMENTED_BODIES: set[tuple[str, str]] = set()
BODY_OPS = [
    op
    for op in OPS
    if op[0] != "GET"
    and ("requestBody" in SPEC["paths"][op[1]][op[0].lower()] or op in UNDOCUMENTED_BODIES)
]
PATH_OPS = [op for op in OPS if "{" in op[1]]


def op_id(op: tuple[str, str]) -> str:
    return f"{op[0]} {op[1]}"


def changes(before: dict[str, Any], after: dict[str, Any], what: str) -> list[str]:
    """One line per part of two snapshots that differs: what came and what went."""
    out = []
    for key in before:
        if before[key] != after[key]:
            came = [x for x in after[key] if x not in before[key]][:5]
            went = [x for x in before[key] if x not in after[key]][:5]
            out.append(f"{what} changed {key}: new {came}, gone {went}")
    return out


# -- the world the matrix attacks ----------------------------------------------------------


def notebook(*sources: str) -> dict[str, Any]:
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"c{i}",
            "metadata": {},
            "outputs": [],
            "source": source,
        }
        for i, source in enumerate(sources)
    ]
    kernel = {"name": "python3", "language": "python", "display_name": "Py"}
    return {"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}


NOTEBOOK = notebook("x = 1")
# The server of ann's live allocation (``World.alloc``), and those of the allocations made
# afresh for an allowed call (``FRESH``): released, or stopped on the hub where none runs.
HELD = "held"
FRESH_SERVERS = ("fresh", "")
UNFINISHED = "queued,starting,running,preempting"
# Eight whole GPUs at once never fit on six: the job stays queued, and costs nothing.
QUEUED_JOB = {"profile": "gpu-1", "slices": 8, "path": "m.ipynb", "notebook": NOTEBOOK}


class NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A session that never carries one identity's cookies into another's request."""

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False


@dataclass
class World:
    hub: Hub
    tokens: dict[str, str | None]
    alloc: int = 0  # ann's live interactive allocation
    bob_alloc: int = 0
    job: int = 0  # ann's queued job
    bob_job: int = 0
    max_job: int = 0
    gpu: str = ""
    allocs: dict[str, set[int]] = field(default_factory=lambda: {"ann": set(), "bob": set()})
    jobs: dict[str, set[int]] = field(default_factory=lambda: {"ann": set(), "bob": set()})
    counter: Any = field(default_factory=itertools.count)
    session: requests.Session = field(default_factory=requests.Session)

    def send(
        self,
        identity: str,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        direct: bool = False,
    ) -> requests.Response:
        """``direct``: to the service itself rather than through the hub's proxy."""
        headers = {}
        token = self.tokens[identity]
        if token:
            headers["Authorization"] = f"token {token}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        base = self.hub.service_url.rstrip("/") if direct else f"{self.hub.url}{PREFIX}"
        return self.session.request(
            method,
            f"{base}{path}",
            data=data,
            headers=headers,
            allow_redirects=False,
            timeout=60,
        )

    def ok(self, identity: str, method: str, path: str, body: Any = None) -> Any:
        r = self.send(identity, method, path, body)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return strict_json(r.content) if r.content else None

    # -- resources -----------------------------------------------------------------------

    def new_alloc(self, user: str = "ann", server: str | None = None) -> int:
        server = f"m{next(self.counter)}" if server is None else server
        body = {"user": user, "profile": "share-250", "server_name": server}
        alloc = self.ok("service", "POST", "/api/allocations", body)
        self.allocs[user].add(alloc["id"])
        return int(alloc["id"])

    def new_job(self, user: str = "ann") -> int:
        job = self.ok(user, "POST", "/api/jobs", QUEUED_JOB)
        assert job["state"] == "queued", job
        self.jobs[user].add(job["id"])
        self.max_job = max(self.max_job, job["id"])
        return int(job["id"])

    def newest_job(self) -> int:
        """The highest job id (ids only grow: the next one does not exist until submitted).
        Listing every job would fetch each one's parameters, however large."""
        while self.send("admin", "GET", f"/api/jobs/{self.max_job + 1}").status_code == 200:
            self.max_job += 1
        return self.max_job

    def params(self) -> dict[str, str]:
        return {
            "allocation_id": str(self.alloc),
            "job_id": str(self.job),
            "gpu_uuid": self.gpu,
            "subject": "user",
            "name": "ann",
            "user": "ann",
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything a write could change, read as the gpuslice admin."""
        allocs = self.ok("admin", "GET", "/api/allocations?state=all&limit=5000")["allocations"]
        events = self.ok("admin", "GET", "/api/events?limit=5000")["events"]
        actions = self.ok("admin", "GET", "/api/admin/actions?limit=1000")["actions"]
        jobs = self.ok("admin", "GET", f"/api/jobs?state={UNFINISHED}")["jobs"]
        inventory = self.ok("admin", "GET", "/api/inventory")
        overview = self.ok("admin", "GET", "/api/admin/overview")
        reports = sorted(
            (s["holder"]["allocation_id"], s["holder"]["utilization"], s["holder"]["reported_at"])
            for host in overview["hosts"]
            for gpu in host["gpus"]
            for s in gpu["slices"]
            if s["holder"]
        )
        return {
            "allocations": sorted(
                (a["id"], a["user"], a["state"], a.get("release_reason")) for a in allocs
            ),
            "events": [(e["id"], e["kind"], e.get("user"), e.get("actor")) for e in events],
            "actions": [a["id"] for a in actions],
            "quotas": self.ok("admin", "GET", "/api/admin/quotas")["overrides"],
            "exemptions": self.ok("admin", "GET", "/api/admin/exemptions")["exemptions"],
            # every unfinished job, and the newest id (a job created and cancelled counts)
            "jobs": [*sorted((j["id"], j["user"], j["state"]) for j in jobs), self.newest_job()],
            "drained": sorted(
                (g["uuid"], g["drained"]) for h in inventory["hosts"] for g in h["gpus"]
            ),
            "usage_reports": reports,
        }

    def tidy(self) -> None:
        """Back to the starting state: only the world's allocations and jobs, no overrides,
        exemptions or drains (each recreated if an operation under test removed it)."""
        keep = {self.alloc, self.bob_alloc}
        for a in self.ok("admin", "GET", "/api/allocations")["allocations"]:
            if a["id"] not in keep and a["purpose"] == "interactive":
                self.ok("admin", "DELETE", f"/api/allocations/{a['id']}")
        live = {a["id"] for a in self.ok("admin", "GET", "/api/allocations")["allocations"]}
        if self.alloc not in live:
            self.alloc = self.new_alloc("ann", HELD)
        if self.bob_alloc not in live:
            self.bob_alloc = self.new_alloc("bob")
        states = {}
        for j in self.ok("admin", "GET", f"/api/jobs?state={UNFINISHED}")["jobs"]:
            if j["id"] in (self.job, self.bob_job):
                states[j["id"]] = j["state"]
            else:
                self.ok("admin", "DELETE", f"/api/jobs/{j['id']}")
        if states.get(self.job) != "queued":
            self.job = self.new_job("ann")
        if states.get(self.bob_job) != "queued":
            self.bob_job = self.new_job("bob")
        for o in self.ok("admin", "GET", "/api/admin/quotas")["overrides"]:
            name = "default_user" if o["subject"] == "default_user" else f"user/{o['name']}"
            if o["subject"] == "group":
                name = f"group/{o['name']}"
            self.ok("admin", "DELETE", f"/api/admin/quotas/{name}")
        for e in self.ok("admin", "GET", "/api/admin/exemptions")["exemptions"]:
            self.ok("admin", "DELETE", f"/api/admin/exemptions/{e['user']}")
        for host in self.ok("admin", "GET", "/api/inventory")["hosts"]:
            for g in host["gpus"]:
                if g["drained"]:
                    body = {"drained": False}
                    self.ok("admin", "POST", f"/api/gpus/{g['uuid']}/drain", body)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(
        tmp_path_factory.mktemp("attack-hub"),
        hosts=HOSTS,
        profiles=SIM_PROFILES,
        # no utilization reports from running jobs: nothing but the calls under test writes
        extra_service_config="c.JobManager.usage_interval = 0",
    )
    try:
        tokens: dict[str, str | None] = {
            "anon": None,
            "ann": hub.add_user("ann"),
            "bob": hub.add_user("bob"),
            "admin": hub.add_user("admin"),
            "service": hub.service_token,
        }
        # A token with the scopes the gpuslice spawner gives ann's server
        # (GPUSliceMixin.server_token_scopes): what her server extension calls the service
        # with. It is a user token of ann's with fewer scopes, confined to one server; a
        # spawned server's token would be no different, and this hub has no spawner, so none
        # is started. Its server holds ``w.alloc``; the allocations an allowed DELETE or
        # reclaim takes are made afresh for the servers ``FRESH`` names, which it holds too.
        tokens["ann_server"] = server_token(hub, "ann", (HELD, *FRESH_SERVERS))
        w = World(hub, tokens)
        w.session.cookies.set_policy(NoCookies())
        w.alloc, w.bob_alloc = w.new_alloc("ann", HELD), w.new_alloc("bob")
        w.job, w.bob_job = w.new_job("ann"), w.new_job("bob")
        inventory = w.ok("admin", "GET", "/api/inventory")
        w.gpu = next(
            g["uuid"]
            for g in inventory["hosts"][0]["gpus"]
            if g["mig_mode"] != "enabled" and not g["holders"]
        )
        me = w.ok("ann_server", "GET", "/api/allocations")["allocations"]
        assert [a["id"] for a in me] == [w.alloc], "ann's server token must reach the service"
        yield w
    finally:
        hub.stop()


def server_token(hub: Hub, user: str, servers: tuple[str, ...]) -> str:
    """A token of ``user`` scoped as the spawner scopes a server's, for ``servers``."""
    r = hub.hub_api(
        "POST",
        f"/users/{user}/tokens",
        json={
            "note": f"{user}'s server, as the spawner scopes it",
            "expires_in": 3600,
            "scopes": [
                f"users:activity!user={user}",
                *(f"access:servers!server={user}/{name}" for name in servers),
                "access:services!service=gpuslice",
            ],
        },
    )
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


# -- how each operation is called ----------------------------------------------------------


def _quota(w: World) -> None:
    w.ok("admin", "PUT", "/api/admin/quotas/user/ann", {"max_slices": 50, "reason": "matrix"})


def _default_quota(w: World) -> None:
    w.ok("admin", "PUT", "/api/admin/quotas/default_user", {"max_slices": 50, "reason": "m"})


def _exemption(w: World) -> None:
    w.ok("admin", "PUT", "/api/admin/exemptions/ann", {"reason": "matrix", "hours": 1})


def _undrained(w: World) -> None:
    w.ok("admin", "POST", f"/api/gpus/{w.gpu}/drain", {"drained": False})


BODIES: dict[tuple[str, str], Callable[[World], Any]] = {
    ("POST", "/api/allocations"): lambda w: {
        "user": "ann",
        "profile": "share-250",
        "server_name": f"m{next(w.counter)}",
    },
    ("POST", "/api/allocations/{allocation_id}/reclaim"): lambda w: {
        "reason": "matrix",
        "idle_seconds": 1,
    },
    ("POST", "/api/events"): lambda w: {
        "kind": "idle-warning",
        "reason": "matrix",
        "detail": {"allocation_id": w.alloc, "idle_seconds": 1},
    },
    ("POST", "/api/allocations/{allocation_id}/usage"): lambda w: {
        "utilization": 10,
        "memory_mib": 1,
        "idle_seconds": 0,
        "interval_seconds": 60,
    },
    ("POST", "/api/gpus/{gpu_uuid}/drain"): lambda w: {"drained": True, "reason": "matrix"},
    ("PUT", "/api/admin/quotas/{subject}/{name}"): lambda w: {
        "max_slices": 40,
        "max_milli": 4000,
        "reason": "matrix",
    },
    ("DELETE", "/api/admin/quotas/{subject}/{name}"): lambda w: {"reason": "matrix"},
    ("PUT", "/api/admin/quotas/default_user"): lambda w: {
        "max_slices": 40,
        "max_milli": 4000,
        "reason": "matrix",
    },
    ("DELETE", "/api/admin/quotas/default_user"): lambda w: {"reason": "matrix"},
    ("PUT", "/api/admin/exemptions/{user}"): lambda w: {"reason": "matrix", "hours": 2},
    ("DELETE", "/api/admin/exemptions/{user}"): lambda w: {"reason": "matrix"},
    ("POST", "/api/jobs"): lambda w: {"user": "ann", **QUEUED_JOB},
    ("DELETE", "/api/jobs/{job_id}"): lambda w: {"reason": "matrix"},
    ("POST", "/api/jobs/{job_id}/preempt"): lambda w: {"reason": "matrix"},
}
QUERIES: dict[tuple[str, str], Callable[[World], str]] = {
    ("GET", "/api/idle-policy"): lambda w: f"?allocation_id={w.alloc}",
    ("DELETE", "/api/allocations/{allocation_id}"): lambda w: "?reason=matrix",
}
# Run before the refused calls and before each allowed one: the thing a DELETE removes exists,
# the GPU a drain drains is not drained yet.
PREPARE: dict[tuple[str, str], Callable[[World], None]] = {
    ("DELETE", "/api/admin/quotas/{subject}/{name}"): _quota,
    ("DELETE", "/api/admin/quotas/default_user"): _default_quota,
    ("DELETE", "/api/admin/exemptions/{user}"): _exemption,
    ("POST", "/api/gpus/{gpu_uuid}/drain"): _undrained,
}
# Each allowed call of these gets a resource of its own (they end or stop it). The servers'
# names are those ann's server token is scoped to: a server's token acts on its own slice.
FRESH: dict[tuple[str, str], Callable[[World], dict[str, str]]] = {
    ("DELETE", "/api/allocations/{allocation_id}"): lambda w: {
        "allocation_id": str(w.new_alloc(server="fresh"))
    },
    # ann's default server: the hub answers the stop at once (it is not running), so the
    # service records nothing after its reply that could land in the next snapshot
    ("POST", "/api/allocations/{allocation_id}/reclaim"): lambda w: {
        "allocation_id": str(w.new_alloc(server=""))
    },
    ("DELETE", "/api/jobs/{job_id}"): lambda w: {"job_id": str(w.new_job())},
}


def url(op: tuple[str, str], params: dict[str, str], query: str = "") -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: params[m.group(1)], op[1]) + query


def call(
    w: World,
    op: tuple[str, str],
    identity: str,
    params: dict[str, str] | None = None,
    direct: bool = False,
) -> requests.Response:
    query = QUERIES[op](w) if op in QUERIES else ""
    body = BODIES[op](w) if op in BODIES else None
    return w.send(identity, op[0], url(op, params or w.params(), query), body, direct=direct)


def others(w: World, identity: str) -> tuple[set[str], set[int], set[int]]:
    """Whose data ``identity`` must never see: (users, their allocations, their jobs)."""
    users = {"anon": {"ann", "bob"}, "bob": {"ann"}, "ann": {"bob"}, "ann_server": {"bob"}}.get(
        identity, set()
    )
    allocs = set().union(*(w.allocs[u] for u in users)) if users else set()
    jobs = set().union(*(w.jobs[u] for u in users)) if users else set()
    return users, allocs, jobs


def problems_with(
    w: World, op: tuple[str, str], identity: str, want: str, ok: frozenset[int], r: Any
) -> list[str]:
    s = r.status_code
    where = f"{op_id(op)} as {identity}: {s}"
    found: list[str] = []
    is_api = op[1].startswith("/api/")
    json_type = r.headers.get("Content-Type", "").startswith("application/json")
    message = ""
    if s >= 500:
        found.append(f"{where} server error: {r.text[:300]}")
    if json_type or (is_api and s >= 400):
        if s >= 400:
            found += [f"{where} {p}" for p in error_problems(s, r.content)]
        else:
            try:
                strict_json(r.content)
            except ValueError as e:
                found.append(f"{where} invalid JSON ({e})")
        if s >= 400 and not found:
            message = strict_json(r.content)["message"]
    if want == A:
        hiding = s == 404 and re.match(r"no (job|allocation) \d", message)
        if not (200 <= s < 300 or s in ok) or hiding:
            found.append(f"{where}, expected to be allowed: {r.text[:300]}")
    elif want == D and s not in (403, 404):
        found.append(f"{where}, expected a refusal (403/404): {r.text[:300]}")
    elif want == H and s != 404:
        found.append(f"{where}, expected 404 (as for a job that does not exist): {r.text[:300]}")
    elif want == LOGIN and s != 302:
        found.append(f"{where}, expected a redirect to the hub's login")
    users, allocs, jobs = others(w, identity)
    if users:
        if json_type and s < 500:
            try:
                data = strict_json(r.content)
            except ValueError:
                data = None
            found += [
                f"{where} carries another user's data: {x}"
                for x in leaks(data, users, allocs, jobs)
            ]
        named = names_in_text(r.text, users) if identity != "anon" or s != 302 else []
        found += [f"{where} names {u}: {r.text[:300]}" for u in named]
    return found


# -- 1. the authorization matrix -------------------------------------------------------------


def test_the_table_covers_every_documented_operation():
    missing = [op_id(op) for op in OPS if op not in TABLE]
    stale = [op_id(op) for op in TABLE if op not in OPS]
    assert not missing, f"operations in docs/openapi.yaml without a row in TABLE: {missing}"
    assert not stale, f"TABLE rows for operations the spec no longer has: {stale}"
    assert all(set(w) == set(IDENTITIES) for w, _ in TABLE.values())
    for table in (BODIES, QUERIES, PREPARE, FRESH, UNDOCUMENTED_BODIES, OUT_OF_RANGE):
        assert set(table) <= set(OPS), set(table) - set(OPS)


def test_the_snapshot_sees_every_kind_of_write(world: World):
    """A refusal "writes nothing" only means something if every kind of write shows."""
    w = world
    writes: dict[str, Callable[[], Any]] = {
        "allocations": w.new_alloc,
        "events": lambda: w.ok("ann", "POST", "/api/events", BODIES[("POST", "/api/events")](w)),
        "usage_reports": lambda: w.ok(
            "ann",
            "POST",
            f"/api/allocations/{w.alloc}/usage",
            {"utilization": 42.5, "memory_mib": 7},
        ),
        "quotas": lambda: _quota(w),
        "exemptions": lambda: _exemption(w),
        "drained": lambda: w.ok("admin", "POST", f"/api/gpus/{w.gpu}/drain", {}),
        "jobs": w.new_job,
    }
    try:
        for key, write in writes.items():
            before = w.snapshot()
            write()
            assert before[key] != w.snapshot()[key], f"the snapshot misses writes to {key}"
    finally:
        w.tidy()


@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_authorization_matrix(world: World, op: tuple[str, str]):
    if op not in TABLE:
        pytest.fail(f"{op_id(op)} has no row in TABLE: decide who may call it")
    expect, ok = TABLE[op]
    w = world
    found: list[str] = []
    writes = op[0] != "GET"
    try:
        if op in PREPARE:
            PREPARE[op](w)
        before = w.snapshot() if writes else None
        for identity in IDENTITIES:
            if expect[identity] != A:
                r = call(w, op, identity)
                found += problems_with(w, op, identity, expect[identity], ok, r)
        if writes:
            found += changes(before, w.snapshot(), f"{op_id(op)}: a refused call")
        for identity in IDENTITIES:
            if expect[identity] == A:
                if op in PREPARE:
                    PREPARE[op](w)
                params = {**w.params(), **FRESH[op](w)} if op in FRESH else None
                r = call(w, op, identity, params)
                found += problems_with(w, op, identity, A, ok, r)
    finally:
        w.tidy()
    assert not found, "\n".join(found)


def test_no_user_acts_or_lists_as_another(world: World):
    """What the matrix does not reach: naming another user in a query or a body."""
    w = world
    found: list[str] = []
    try:
        found += impersonations(w)
    finally:
        w.tidy()
    assert not found, "\n".join(found)


def impersonations(w: World) -> list[str]:
    found = []
    before = w.snapshot()
    for identity in ("bob", "ann_server"):
        target = "ann" if identity == "bob" else "bob"
        for path in (
            f"/api/allocations?user={target}",
            f"/api/events?user={target}",
            f"/api/jobs?user={target}",
            f"/api/profiles?user={target}",
            f"/api/allocations?user={target}&state=all",
        ):
            r = w.send(identity, "GET", path)
            if r.status_code != 403:
                found.append(f"GET {path} as {identity}: {r.status_code} {r.text[:200]}")
    # bob reports on his own allocation, in ann's name
    for body in (
        {"kind": "idle-culled", "user": "ann", "detail": {"allocation_id": w.bob_alloc}},
        {"kind": "idle-warning", "detail": {"allocation_id": w.alloc}},
    ):
        r = w.send("bob", "POST", "/api/events", body)
        # on his own: 403 (not in ann's name); on ann's: 404, as if it did not exist
        want = 404 if body["detail"]["allocation_id"] == w.alloc else 403
        if r.status_code != want:
            found.append(f"POST /api/events {body} as bob: {r.status_code} {r.text[:200]}")
    for body in (
        {**QUEUED_JOB, "user": "ann"},
        {**QUEUED_JOB, "groups": ["physics"]},
    ):
        r = w.send("bob", "POST", "/api/jobs", body)
        if r.status_code != 403:
            found.append(f"POST /api/jobs as bob with {set(body) - set(QUEUED_JOB)}: {r.text}")
    # a user cannot allocate, not even for themself, nor state groups
    for body in (
        {"profile": "share-250", "server_name": "x"},
        {"profile": "share-250", "server_name": "x", "user": "bob"},
        {"profile": "mig-3g.40gb", "server_name": "x", "groups": ["physics"]},
    ):
        for identity in ("bob", "ann_server", "admin"):
            r = w.send(identity, "POST", "/api/allocations", body)
            if r.status_code != 403:
                found.append(f"POST /api/allocations {body} as {identity}: {r.status_code}")
    return found + changes(before, w.snapshot(), "a refused impersonation")


def test_a_server_token_acts_on_its_own_slice_only(world: World):
    """Ann's server's token is hers, confined to that server: her other server's slice is,
    to it, as one that does not exist (no report, reclaim, release, or read of it); ann's
    own token still reaches both."""
    w = world
    found: list[str] = []
    try:
        sibling = w.new_alloc("ann", "sibling")
        before = w.snapshot()
        params = {**w.params(), "allocation_id": str(sibling)}
        for op in (*REPORTS, *((m, "/api/allocations/{allocation_id}") for m in ("GET", "DELETE"))):
            body = BODIES[op](w) if op in BODIES else None
            if op[1] == "/api/events":
                body["detail"]["allocation_id"] = sibling
            r = w.send("ann_server", op[0], url(op, params), body)
            if (
                r.status_code != 404
                or strict_json(r.content)["message"] != f"no allocation {sibling}"
            ):
                found.append(f"{op_id(op)} on a sibling's slice: {r.status_code} {r.text[:200]}")
        r = w.send("ann_server", "GET", f"/api/idle-policy?allocation_id={sibling}")
        if r.status_code != 404:
            found.append(f"GET /api/idle-policy of a sibling's slice: {r.status_code} {r.text}")
        listed = {
            a["id"] for a in w.ok("ann_server", "GET", "/api/allocations?state=all")["allocations"]
        }
        if sibling in listed or w.alloc not in listed:
            found.append(f"ann's server lists {sorted(listed)} (own {w.alloc}, sibling {sibling})")
        found += changes(before, w.snapshot(), "a server token's calls on a sibling's slice")
        mine = {a["id"] for a in w.ok("ann", "GET", "/api/allocations")["allocations"]}
        if not {sibling, w.alloc} <= mine:
            found.append(f"ann's own token lists {sorted(mine)}")
    finally:
        w.tidy()
    assert not found, "\n".join(found)


def test_a_metrics_service_reads_metrics_and_nothing_else(world: World):
    """The token of a hub service given the metrics scope (a Prometheus scraper) reads
    /metrics; every other operation refuses it, saying so, and none takes it for the user of
    the same name (a user "prom" exists, with a slice of her own)."""
    w = world
    found: list[str] = []
    prom = w.hub.config["metrics_token"]
    w.hub.add_user("prom")
    w.tokens["prom"] = prom
    w.allocs["prom"] = set()
    try:
        mine = w.new_alloc("prom")
        before = w.snapshot()
        for op in OPS:
            if op[1] in ("/api/health", "/oauth_callback"):
                continue  # (public)
            params = {**w.params(), "allocation_id": str(mine), "user": "prom", "name": "prom"}
            r = call(w, op, "prom", params, direct=True)
            if op == ("GET", "/metrics"):
                if r.status_code != 200:
                    found.append(f"GET /metrics: {r.status_code} {r.text[:200]}")
            elif op[1] in ("/", "/admin"):
                if r.status_code not in (302, 403):
                    found.append(f"{op_id(op)}: {r.status_code} {r.text[:200]}")
            elif r.status_code != 403 or "/metrics only" not in r.text:
                found.append(f"{op_id(op)}: {r.status_code} {r.text[:200]}")
        found += changes(before, w.snapshot(), "a metrics service's calls")
    finally:
        w.tokens.pop("prom")
        w.allocs.pop("prom")
        w.tidy()
    assert not found, "\n".join(found)


ENV_CELLS = (
    "import hashlib, os\n"
    "print('ENV-HASHES', sorted(hashlib.sha256(v.encode()).hexdigest()"
    " for v in os.environ.values()))\n"
    "print('ENV-NAMES', sorted(os.environ))",
    "import time\ntime.sleep(600)",
)
REPORTS = (
    ("POST", "/api/allocations/{allocation_id}/usage"),
    ("POST", "/api/allocations/{allocation_id}/reclaim"),
    ("POST", "/api/events"),
)


def test_a_running_job_holds_no_token_and_its_slice_takes_no_reports(world: World):
    """A running batch job's environment holds no token (its code can do what an anonymous
    caller can); its slice, like a released one, takes no holder's report, and only an admin
    preempts the job."""
    w = world
    found: list[str] = []
    body = {"profile": "share-250", "path": "env.ipynb", "notebook": notebook(*ENV_CELLS)}
    job = w.ok("ann", "POST", "/api/jobs", body)
    w.jobs["ann"].add(job["id"])
    w.max_job = max(w.max_job, job["id"])
    path = f"/api/jobs/{job['id']}"
    try:

        def first_cell_ran() -> Any:
            r = w.send("ann", "GET", f"{path}/output")
            return r.status_code == 200 and b"ENV-NAMES" in r.content and strict_json(r.content)

        out = wait_for(first_cell_ran, 120, "the job's first cell to run")
        outputs = [o.get("text", "") for c in out["cells"] for o in c.get("outputs", [])]
        text = "".join("".join(t) if isinstance(t, list) else t for t in outputs)
        env = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith("ENV-"))
        hashes = set(ast.literal_eval(env["ENV-HASHES"]))
        names = ast.literal_eval(env["ENV-NAMES"])
        secrets = {t for t in w.tokens.values() if t} | {w.hub.admin_token}
        held = [n for n in secrets if hashlib.sha256(n.encode()).hexdigest() in hashes]
        assert not held, "a running job's environment holds a token"
        assert not [n for n in names if "TOKEN" in n or n.startswith("JUPYTERHUB_API")], names
        state = wait_for(
            lambda: (j := w.ok("ann", "GET", path))["state"] == "running" and j,
            60,
            "the job to be running",
        )
        [batch] = state["allocation_ids"]
        w.allocs["ann"].add(batch)
        released = w.new_alloc(server="fresh")  # (a server ann's server token holds)
        w.ok("ann", "DELETE", f"/api/allocations/{released}")
        before = w.snapshot()
        for alloc in (batch, released):
            for op in REPORTS:
                body = BODIES[op](w)
                if op[1] == "/api/events":
                    body["detail"]["allocation_id"] = alloc
                for identity in IDENTITIES:
                    r = w.send(identity, op[0], url(op, {"allocation_id": str(alloc)}), body)
                    # the owner, or the token of the server that held it (a batch slice is
                    # no server's); another user, or another server's token, is told
                    # nothing about it; admins and the service token are no holders
                    holder = identity == "ann" or (identity == "ann_server" and alloc != batch)
                    hidden = identity == "bob" or identity == "ann_server"
                    want = 409 if holder else 404 if hidden else 403
                    if r.status_code != want:
                        what = "batch" if alloc == batch else "released"
                        found.append(f"{op_id(op)} on the {what} slice as {identity}: {r.text}")
        # its slice is the job's while it runs: the owner and an admin are told to cancel
        # the job; ann's server's token is told nothing of it (not its server's slice)
        for identity, want in (("ann", 409), ("admin", 409), ("ann_server", 404), ("bob", 404)):
            r = w.send(identity, "DELETE", f"/api/allocations/{batch}")
            if r.status_code != want or (want == 409 and "cancel the job" not in r.text):
                found.append(f"DELETE the batch slice as {identity}: {r.status_code} {r.text}")
        preempt, _ = TABLE[("POST", "/api/jobs/{job_id}/preempt")]
        for identity in IDENTITIES:
            if preempt[identity] != A:
                r = w.send(identity, "POST", f"{path}/preempt", {"reason": "matrix"})
                if r.status_code not in (403, 404):
                    found.append(f"POST {path}/preempt as {identity}: {r.status_code} {r.text}")
        found += changes(before, w.snapshot(), "refused reports and preemptions")
        r = w.send("admin", "POST", f"{path}/preempt", {"reason": "matrix"})
        if r.status_code != 202 or strict_json(r.content)["state"] != "preempting":
            found.append(f"POST {path}/preempt as admin: {r.status_code} {r.text[:300]}")
    finally:
        w.tidy()
    assert not found, "\n".join(found)


# -- 2. bad input ------------------------------------------------------------------------


def attacker(op: tuple[str, str]) -> str:
    """The identity allowed to make the call: bad input must fail on the input itself."""
    expect, _ = TABLE[op]
    return next(i for i in ("admin", "ann", "service") if expect[i] == A)


def documented_fields(op: tuple[str, str]) -> dict[str, tuple[dict[str, Any], bool]]:
    schema = body_schema(SPEC, SPEC["paths"][op[1]][op[0].lower()])
    if schema is None:  # an undocumented {"reason"} body
        return {"reason": ({"type": "string"}, False)}
    return fields(SPEC, schema)


def limit_for(op: tuple[str, str]) -> int:
    traits = GPUSliceService.class_traits()
    key = "max_notebook_bytes" if op == ("POST", "/api/jobs") else "max_body_bytes"
    return int(traits[key].default_value)


# Values of the right type the service must not store: out of range, or nested where the
# spec says "free-form" (an event's detail), where a client could smuggle figures in.
OUT_OF_RANGE: dict[tuple[str, str], list[tuple[str, Any]]] = {
    ("POST", "/api/allocations"): [
        ("priority", 1001),
        ("priority", 2**64),
        ("server_name", "a/b"),
        ("server_name", "x" * 300),
        ("purpose", "batch"),
        ("profile", "no-such-profile"),
    ],
    ("POST", "/api/allocations/{allocation_id}/reclaim"): [
        ("idle_seconds", -1),
        ("idle_seconds", 1e10),
        ("reason", ""),
        ("reason", "x" * 1001),
    ],
    ("POST", "/api/events"): [
        ("kind", "idle-culled-everything"),
        ("reason", "x" * 1001),
        ("user", "bob"),
        ("detail.allocation_id", "1"),
        ("detail.allocation_id", 1.5),
        ("detail.allocation_id", True),
        ("detail.allocation_id", None),
        ("detail.allocation_id", -1),
        ("detail.allocation_id", 2**64),
        ("detail.idle_seconds", -1),
        ("detail.idle_seconds", 1e10),
        ("detail.idle_seconds", "1"),
        ("detail.memory_mib", 1e10),
        ("detail.scope", "cluster"),
        ("detail.kernel_id", 7),
        ("detail.kernel_id", "k" * 200),
    ],
    ("POST", "/api/allocations/{allocation_id}/usage"): [
        ("utilization", 100.5),
        ("utilization", -1),
        ("memory_mib", 1e10),
        ("idle_seconds", -1),
        ("interval_seconds", 1e8),
    ],
    ("POST", "/api/gpus/{gpu_uuid}/drain"): [("reason", "x" * 1001)],
    ("PUT", "/api/admin/quotas/{subject}/{name}"): [
        ("max_slices", -1),
        ("max_slices", 1e300),
        ("max_milli", 1.5),
        ("max_milli", 2**64),
        ("reason", ""),
    ],
    ("PUT", "/api/admin/quotas/default_user"): [("max_slices", -0.5), ("max_milli", -1)],
    ("PUT", "/api/admin/exemptions/{user}"): [
        ("hours", 0),
        ("hours", -1),
        ("hours", 8761),
        ("hours", 1e300),
        ("reason", " "),
    ],
    ("POST", "/api/jobs"): [
        ("slices", 0),
        ("slices", 9),
        ("checkpoint_interval", 0),
        ("checkpoint_interval", 1e10),
        ("max_runtime", 1e12),
        ("path", "x" * 2000),
        ("priority", "urgent"),
        ("parameters", {"1x": 1}),
        ("parameters", {"__class__": 1}),
        ("notebook", {"cells": "nope"}),
        ("profile", "no-such-profile"),
    ],
}


def hostile_bodies(w: World, op: tuple[str, str]) -> list[tuple[str, bytes, set[int] | None]]:
    """(what, raw body, the 4xx it must get or None for any 4xx)."""
    base = BODIES[op](w)
    documented = documented_fields(op)
    out: list[tuple[str, bytes, set[int] | None]] = []
    for name, (schema, required) in documented.items():
        for label, value in wrong_types(schema, required):
            out.append((f"{name} = {label}", json.dumps(patched(base, name, value)).encode(), None))
    for name, value in OUT_OF_RANGE.get(op, []):
        body = json.dumps(patched(base, name, value)).encode()
        out.append((f"{name} = {json.dumps(value)[:40]}", body, None))
    two_mib = 2 * 1024 * 1024
    out.append(("a 2 MiB body", big_body(two_mib), {413} if two_mib > limit_for(op) else None))
    out.append(("a 50 000-deep array", deep_array(50_000), None))
    numbers = [n for n, (s, _) in documented.items() if s.get("type") in ("number", "integer")]
    for name in numbers or ["reason"]:
        for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"):
            out.append((f"{name} = {literal.decode()}", with_raw(base, name, literal), None))
    strings = [n for n, (s, _) in documented.items() if s.get("type") == "string"]
    out.append(("a lone surrogate", b'{"reason": "\\ud800"}', None))
    out.append(("a lone surrogate in a key", b'{"\\udfff": 1}', None))
    for name in strings:
        out.append((f"{name} = a lone surrogate", with_raw(base, name, b'"\\ud800"'), None))
        out.append((f"{name} = invalid UTF-8", with_raw(base, name, b'"\xc3\x28\xff"'), None))
    out.append(("invalid UTF-8", b'{"reason": "\xff\xfe"}', None))
    out.append(("a 200 000-key object", many_keys(200_000), None))
    for name, (schema, _) in documented.items():
        if schema.get("type") == "object":
            nested = with_raw(base, name, many_keys(200_000))
            out.append((f"{name} = a 200 000-key object", nested, None))
    for raw in (b"[]", b"null", b"1", b'"reason"', b"{", b'{"reason": "x"} trailing'):
        out.append((f"the body {raw.decode()!r}", raw, None))
    return out


def refusal_problems(where: str, r: requests.Response) -> list[str]:
    """What is wrong with the answer to bad input: anything but a 4xx, or an error body
    that is not strict JSON with a message."""
    problems = [] if 400 <= r.status_code < 500 else [f"{where} {r.text[:300]}"]
    if r.status_code >= 400:
        problems += [f"{where} {p}" for p in error_problems(r.status_code, r.content)]
    return problems


@pytest.mark.parametrize("op", BODY_OPS, ids=op_id)
def test_bad_bodies_are_4xx_with_a_message_and_write_nothing(world: World, op: tuple[str, str]):
    w = world
    identity = attacker(op)
    found: list[str] = []
    try:
        if op in PREPARE:
            PREPARE[op](w)
        before = w.snapshot()
        for what, raw, statuses in hostile_bodies(w, op):
            query = QUERIES[op](w) if op in QUERIES else ""
            r = w.send(identity, op[0], url(op, w.params(), query), raw=raw)
            where = f"{op_id(op)} as {identity} with {what}: {r.status_code}"
            found += refusal_problems(where, r)
            if 400 <= r.status_code < 500 and statuses and r.status_code not in statuses:
                found.append(f"{where}, expected {sorted(statuses)}: {r.text[:200]}")
        found += changes(before, w.snapshot(), f"{op_id(op)}: bad input")
    finally:
        w.tidy()
    assert not found, "\n".join(found)


# (value, sent to the service directly): configurable-http-proxy itself answers a path with
# invalid percent-encoding with its own 500 ("URIError: URI malformed") before the service
# sees it, so "%ff" (not UTF-8) goes to the service directly.
BAD_IDS = (
    ("99999999999999999999999", False),
    ("-1", False),
    ("1e3", False),
    ("0", False),
    ("%ff", True),
)


@pytest.mark.parametrize("op", PATH_OPS, ids=op_id)
def test_bad_path_ids_are_4xx_with_a_message_and_write_nothing(world: World, op: tuple[str, str]):
    w = world
    identity = attacker(op)
    found: list[str] = []
    try:
        if op in PREPARE:
            PREPARE[op](w)
        before = w.snapshot() if op[0] != "GET" else None
        for name in re.findall(r"\{([^}]+)\}", op[1]):
            for bad, direct in BAD_IDS:
                r = call(w, op, identity, {**w.params(), name: bad}, direct=direct)
                where = f"{op_id(op)} as {identity} with {name}={bad[:30]}: {r.status_code}"
                found += refusal_problems(where, r)
        if before is not None:
            found += changes(before, w.snapshot(), f"{op_id(op)}: a bad path")
    finally:
        w.tidy()
    assert not found, "\n".join(found)


# -- 3. afterwards ---------------------------------------------------------------------------


def test_the_admin_read_side_is_still_healthy(world: World):
    w = world
    for path in (
        "/api/admin/overview",
        "/api/admin/usage",
        "/api/admin/capacity",
        "/api/admin/pools",
        "/api/admin/overcommit",
        "/api/admin/quota-suggestions",
        "/api/admin/quotas",
        "/api/admin/actions",
        "/api/events?limit=5000",
        "/api/inventory",
        "/api/profiles",
    ):
        r = w.send("admin", "GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
        strict_json(r.content)
    r = w.send("admin", "GET", "/metrics")
    assert r.status_code == 200, r.text[:500]
    assert r.headers["Content-Type"].startswith("text/plain")
    assert "gpuslice_" in r.text
    assert w.send("anon", "GET", "/api/health").status_code == 200
