"""Concurrency, crash and restart, and startup errors, against a real hub and databases."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.harness.hub import start_hub, wait_for
from tests.harness.postgres import DATABASES


@pytest.fixture(params=DATABASES)
def service_db(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.sqlite"
    return request.getfixturevalue("postgres_db")


def check_no_slice_shared(allocations):
    exclusive, milli = [], defaultdict(int)
    for a in allocations:
        for x in a["assignments"]:
            if x["mig_uuid"]:
                exclusive.append(x["mig_uuid"])
            else:
                milli[x["gpu_uuid"]] += x["milli"]
                if a["kind"] == "gpu":
                    exclusive.append(x["gpu_uuid"])
    assert len(exclusive) == len(set(exclusive)), "an exclusive slice was handed out twice"
    assert all(v <= 1000 for v in milli.values()), milli
    return milli


def test_fifty_concurrent_requesters_never_share_a_slice(hub_factory, service_db):
    hub = hub_factory(db_url=service_db)
    users = [f"user{i:02d}" for i in range(50)]
    for u in users:
        hub.add_user(u)
    profiles = ["mig-1g.10gb", "share-250", "gpu-1"]

    def requester(i: int) -> list[tuple[int, dict]]:
        out = []
        session = requests.Session()
        for k in range(3):
            r = session.post(
                f"{hub.url}/services/gpuslice/api/allocations",
                # the way the hub's spawner asks, for each user
                headers={"Authorization": f"token {hub.service_token}"},
                json={"user": users[i], "profile": profiles[(i + k) % 3], "server_name": f"s{k}"},
                timeout=120,
            )
            out.append((r.status_code, r.json()))
        return out

    with ThreadPoolExecutor(50) as pool:
        results = [x for batch in pool.map(requester, range(50)) for x in batch]
    statuses = {s for s, _ in results}
    assert statuses <= {201, 409}, statuses
    granted = [body for s, body in results if s == 201]
    assert all("No " in body["message"] for s, body in results if s == 409)
    listed = hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"]
    assert sorted(a["id"] for a in listed) == sorted(a["id"] for a in granted)
    milli = check_no_slice_shared(granted)
    # 150 requests for 2 MIG slices and 2 plain GPUs: all of it was handed out, no more
    assert sum(1 for a in granted if a["profile"] == "mig-1g.10gb") == 2
    assert sum(milli.values()) == 2000


def test_sigkilled_service_restarts_with_the_same_allocations(hub_factory, service_db):
    hub = hub_factory(db_url=service_db)
    ann = hub.add_user("ann")
    held = []
    for profile, server in [("mig-1g.10gb", "a"), ("share-250", "b"), ("gpu-1", "c")]:
        r = hub.allocate("ann", profile, server)
        assert r.status_code == 201
        held.append(r.json())
    pid = hub.service_pid()
    os.kill(pid, signal.SIGKILL)
    # the hub restarts its managed service; wait for a new process to answer
    wait_for(lambda: hub.service_pid() != pid, 60, "the hub to restart the service")
    wait_for(lambda: hub.api("GET", "/api/health").status_code == 200, 60, "the restarted service")
    after = hub.api("GET", "/api/allocations", ann).json()["allocations"]
    assert sorted((a["id"], a["profile"], str(a["assignments"])) for a in after) == sorted(
        (a["id"], a["profile"], str(a["assignments"])) for a in held
    )
    # and it keeps handing out only what is free: the share's GPU has room for more shares,
    # but no GPU is whole any more
    r = hub.allocate("ann", "share-250", "d")
    assert r.status_code == 201
    assert r.json()["assignments"][0]["gpu_uuid"] == held[1]["assignments"][0]["gpu_uuid"]
    r = hub.allocate("ann", "gpu-1", "e")
    assert r.status_code == 409


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # (a zombie is gone too: its parent, the hub, is dead, and init reaps it)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return stat[0] == "Z"


def kill_leftovers(hub, service_pid: int) -> None:
    """What a killed hub leaves running, should the test fail: its service, and its proxy
    (in a session of its own: the proxy's pid file names it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(service_pid, signal.SIGKILL)
    pid_file = hub.workdir / "jupyterhub-proxy.pid"
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_hub_killed_outright_takes_its_service_with_it_and_its_restart_serves(hub_factory):
    """A hub SIGKILLed stops none of its managed services (they run in sessions of their
    own): its service must notice and stop, so that the restarted hub's own service can
    take the ledger instead of refusing to start beside a survivor."""
    hub = hub_factory()
    ann = hub.add_user("ann")
    held = hub.allocate("ann", "share-250", "a")
    assert held.status_code == 201
    old_service = hub.service_pid()
    os.kill(hub.proc.pid, signal.SIGKILL)  # the hub alone, not its process group
    hub.proc.wait(10)

    try:
        wait_for(lambda: gone(old_service), 30, "the orphaned service to stop")
    finally:
        kill_leftovers(hub, old_service)
    assert f"the JupyterHub that started this service (process {hub.proc.pid}) is gone" in (
        hub.log()
    )
    # the next hub starts a service that takes the ledger, with the slice still held
    again = start_hub(hub.workdir, reuse=hub.config)
    try:
        assert again.service_pid() != old_service
        mine = again.api("GET", "/api/allocations", ann).json()["allocations"]
        assert [a["id"] for a in mine] == [held.json()["id"]]
        assert "another gpuslice service" not in again.log()
    finally:
        again.stop()


def test_a_hub_killed_while_its_service_starts_takes_that_service_with_it(tmp_path):
    """The service knows which hub started it from the start, which can take half a minute:
    here the hub is killed as soon as the service's process exists (before its Python has
    run a line of gpuslice, as often as not), and the service then waits for the ledger's
    lock, held by the test. (Found by an attack: the hub was read at the end of the start,
    by then init.)"""
    workdir = tmp_path / "hub"
    workdir.mkdir()
    lock = os.open(workdir / "gpuslice.sqlite.service-lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    hub = start_hub(workdir, wait=False)
    service = None
    try:

        def started() -> int | None:
            found = subprocess.run(
                ["pgrep", "-f", f"gpuslice_hub.app --config {workdir}"],
                capture_output=True,
                text=True,
            ).stdout.split()
            return int(found[0]) if found else None

        service = wait_for(started, 60, "the service's process", interval=0.01)
        os.kill(hub.proc.pid, signal.SIGKILL)
        hub.proc.wait(10)
        os.close(lock)  # (the service takes the ledger and goes on starting)
        wait_for(lambda: gone(service), 60, "the orphaned service to stop")
        assert f"the JupyterHub that started this service (process {hub.proc.pid}) is gone" in (
            hub.log()
        )
    finally:
        with contextlib.suppress(OSError):
            os.close(lock)
        if service is not None:
            kill_leftovers(hub, service)
        hub.stop()


def test_reconciler_releases_allocations_of_servers_that_do_not_exist(hub_factory):
    hub = hub_factory(reconcile_interval=0.5, reconcile_grace=1)
    ann = hub.add_user("ann")
    a = hub.allocate("ann", "share-250").json()
    # ann has no server at all: once past the grace period the slice goes back
    wait_for(
        lambda: hub.api("GET", f"/api/allocations/{a['id']}", ann).json()["state"] == "released",
        30,
        "the reconciler to release a server-less allocation",
    )
    events = hub.api("GET", "/api/events", ann).json()["events"]
    assert any(e["kind"] == "released" and e["actor"] == "reconciler" for e in events)


def run_service(tmp_path, config: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cfg = tmp_path / "gpuslice_config.py"
    cfg.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env["JUPYTERHUB_SERVICE_URL"] = "http://127.0.0.1:1"  # never reached: startup fails first
    return subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env,
    )


BASE = """
c.GPUSliceService.gpu_backend = "simulated"
c.GPUSliceService.db_url = "sqlite:///{db}"
c.GPUSliceService.hosts = [{{"name": "n", "cpu_milli": 1000, "memory_mib": 1000,
    "gpus": [{{"model": "T4", "memory_mib": 15360}}]}}]
c.GPUSliceService.profiles = [{{"name": "share-250", "kind": "share", "gpu_milli": 250}}]
"""


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            'c.GPUSliceService.profiles = [{"name": "s", "kind": "share", "gpu_milli": 2000}]',
            "profiles[0].gpu_milli",
        ),
        ("c.GPUSliceService.profiles = []", "profiles: no profiles configured"),
        (
            'c.GPUSliceService.quotas = {"groups": {"a": {"max_slices": "many"}}}',
            "quotas.groups.a.max_slices",
        ),
        (
            'c.GPUSliceService.hosts = [{"name": "n", "cpu_milli": 1, "memory_mib": 1, '
            '"gpus": [{"model": "x", "memory_mib": 1, "count": "two"}]}]',
            "hosts[0].gpus[0].count: must be a positive integer",
        ),
        ('c.GPUSliceService.placement_policy = "clairvoyant"', "placement_policy"),
        ("c.GPUSliceService.usage_retention_days = 0", "usage_retention_days: must be > 0"),
        ("c.GPUSliceService.usage_sample_interval = -5", "usage_sample_interval: must be >= 0"),
    ],
)
def test_malformed_config_stops_the_service_naming_the_key(tmp_path, extra, needle):
    result = run_service(tmp_path, BASE.format(db=tmp_path / "x.sqlite") + extra)
    assert result.returncode == 1
    assert "gpuslice: invalid configuration:" in result.stderr
    assert needle in result.stderr
    # nothing was written: a failed start creates no database
    assert not (tmp_path / "x.sqlite").exists()


def test_unknown_schema_revision_is_refused_with_a_clear_message(tmp_path):
    db = tmp_path / "ledger.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    con.execute("INSERT INTO alembic_version VALUES ('9999')")
    con.commit()
    con.close()
    result = run_service(tmp_path, BASE.format(db=db))
    assert result.returncode == 1
    assert "schema revision 9999" in result.stderr and "Upgrade gpuslice" in result.stderr


def test_upgrade_db_creates_the_schema(tmp_path):
    cfg = tmp_path / "gpuslice_config.py"
    db = tmp_path / "new.sqlite"
    cfg.write_text(BASE.format(db=db))
    result = subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "upgrade-db", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert con.execute("SELECT id FROM ledger_lock").fetchall() == [(1,)]
    assert {"allocations", "claims", "events", "alembic_version"} <= tables
    # a traitlets subcommand: listed in the service's help, with help of its own
    helps = [
        subprocess.run(
            [sys.executable, "-m", "gpuslice_hub.app", *args],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        for args in (["--help"], ["upgrade-db", "--help"])
    ]
    assert "upgrade-db" in helps[0] and "this version's schema" in helps[0]
    assert "--config=<Unicode>" in helps[1] and "Back it up first" in helps[1]
