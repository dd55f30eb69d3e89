"""Allocate + release throughput and latency through the service's REST API.

Starts a real JupyterHub + gpuslice service (simulated GPUs, 8 hosts x 8 GPUs so capacity
never runs out), for SQLite and for PostgreSQL, then drives POST /api/allocations followed
by DELETE /api/allocations/{id} from 1 client and from 50 concurrent clients, each as the
hub's spawner makes them (the service's token, naming the user).

    .venv/bin/python benchmarks/allocation_api.py [--cycles 500] [--db sqlite,postgres]

``--client http.client`` drives it through one kept-alive ``http.client`` connection per
client instead of ``requests`` (whose own CPU is a good part of a cycle on a small machine).
``--rates 25,50`` also paces 50 clients at those cycles per second in all (spawns arriving
at a site's pace rather than back to back), latency counted from each cycle's scheduled start.

Prints one line per configuration: allocations/s (allocate+release cycles per second),
and p50/p99 latency of the allocate call and of the release call, in milliseconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.hub import start_hub  # noqa: E402
from tests.harness.postgres import find_bindir, fresh_database, start_server  # noqa: E402

HOSTS = [
    {
        "name": f"bench-{h}",
        "cpu_milli": 128000,
        "memory_mib": 1024000,
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81920, "count": 8}],
    }
    for h in range(8)
]
PROFILES = [{"name": "share-100", "kind": "share", "gpu_milli": 100, "gpu_memory_mib": 4096}]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


class _Reply:
    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code, self.text = status_code, body.decode()

    def json(self) -> Any:
        return json.loads(self.text)


class LeanSession:
    """One kept-alive connection through ``http.client``: a client whose own CPU is small
    beside the service's (``requests`` spends about 2 ms per cycle on this machine, on the
    same two cores as the service it measures)."""

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
        self.headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}

    def _call(self, method: str, url: str, body: bytes | None = None) -> _Reply:
        self.conn.request(method, urlsplit(url).path, body, self.headers)
        reply = self.conn.getresponse()
        return _Reply(reply.status, reply.read())

    def post(self, url: str, json: Any) -> _Reply:
        return self._call("POST", url, _json_dumps(json).encode())

    def delete(self, url: str) -> _Reply:
        return self._call("DELETE", url)


_json_dumps = json.dumps
CLIENT = "requests"  # or "http.client": --client


def cycles(
    base: str, token: str, user: str, n: int, server_prefix: str
) -> tuple[list[float], list[float]]:
    """``n`` allocate + release cycles for ``user``, as the hub's spawner makes them (the
    service's own token naming the user: users cannot allocate through the API)."""
    s: Any
    if CLIENT == "http.client":
        s = LeanSession(base, token)
    else:
        s = requests.Session()
        s.headers["Authorization"] = f"token {token}"
    alloc, release = [], []
    for i in range(n):
        t0 = time.perf_counter()
        r = s.post(
            f"{base}/api/allocations",
            json={
                "user": user,
                # the spawner states the user's groups (the hub knows them); without them
                # the service would look them up on the hub, one more round trip
                "groups": [],
                "profile": "share-100",
                "server_name": f"{server_prefix}{i}",
            },
        )
        t1 = time.perf_counter()
        assert r.status_code == 201, r.text
        r2 = s.delete(f"{base}/api/allocations/{r.json()['id']}")
        t2 = time.perf_counter()
        assert r2.status_code == 200, r2.text
        alloc.append(t1 - t0)
        release.append(t2 - t1)
    return alloc, release


def paced(base: str, token: str, users: list[str], rate: float, seconds: float) -> str:
    """50 clients (one per user) making allocate + release cycles at ``rate`` cycles a
    second in all, each starting on a schedule (client i's k-th cycle at (50k + i) / rate):
    spawns arriving at a site's pace, not back to back. Latency counts from the scheduled
    start, so a cycle that waits for the one before it counts its wait too."""
    clients = len(users)
    per_client = max(1, int(rate * seconds / clients))
    lock = threading.Lock()
    alloc: list[float] = []
    release: list[float] = []
    start = time.perf_counter() + 1.0

    def client(i: int) -> None:
        s: Any = LeanSession(base, token) if CLIENT == "http.client" else requests.Session()
        if CLIENT != "http.client":
            s.headers["Authorization"] = f"token {token}"
        mine_a, mine_r = [], []
        for k in range(per_client):
            due = start + (clients * k + i) / rate
            time.sleep(max(0.0, due - time.perf_counter()))  # pacing, not synchronisation
            body = {"user": users[i], "groups": [], "profile": "share-100", "server_name": "p"}
            r = s.post(f"{base}/api/allocations", json=body)
            t1 = time.perf_counter()
            assert r.status_code == 201, r.text
            r2 = s.delete(f"{base}/api/allocations/{r.json()['id']}")
            assert r2.status_code == 200, r2.text
            mine_a.append(t1 - due)
            mine_r.append(time.perf_counter() - t1)
        with lock:
            alloc.extend(mine_a)
            release.extend(mine_r)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    done = time.perf_counter() - start
    return (
        f"{clients} clients at {rate:g} cycles/s ({len(alloc) / done:.1f} done/s): "
        f"alloc p50 {pct(alloc, 0.5):5.1f} ms p99 {pct(alloc, 0.99):5.1f} ms  "
        f"release p50 {pct(release, 0.5):5.1f} ms p99 {pct(release, 0.99):5.1f} ms"
    )


def run(
    db_name: str, db_url: str | None, n: int, workdir: Path, rates: list[float] | None = None
) -> None:
    # (as a site runs it: not checking its statements against SQLAlchemy, as the tests do)
    hub = start_hub(workdir, db_url=db_url, hosts=HOSTS, profiles=PROFILES, lean_check=False)
    try:
        users = [f"bench{i:02d}" for i in range(50)]
        for u in users:
            hub.add_user(u)
        token = hub.service_token
        for label, base in (
            ("direct", hub.service_url),
            ("via proxy", f"{hub.url}/services/gpuslice"),
        ):
            cycles(base, token, users[0], 20, "warm")  # warm the token cache and connections
            t0 = time.perf_counter()
            a, r = cycles(base, token, users[0], n, "one")
            dt = time.perf_counter() - t0
            print(
                f"{db_name:10s} {label:9s}  1 client : {n / dt:7.1f} alloc+release/s  "
                f"alloc p50 {pct(a, 0.5):5.1f} ms p99 {pct(a, 0.99):5.1f} ms  "
                f"release p50 {pct(r, 0.5):5.1f} ms p99 {pct(r, 0.99):5.1f} ms",
                flush=True,
            )
        per_client = max(1, n // 50)
        lock = threading.Lock()
        all_a: list[float] = []
        all_r: list[float] = []

        def client(i: int) -> None:
            a, r = cycles(hub.service_url, token, users[i], per_client, "many")
            with lock:
                all_a.extend(a)
                all_r.extend(r)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(50) as pool:
            list(pool.map(client, range(50)))
        dt = time.perf_counter() - t0
        total = per_client * 50
        print(
            f"{db_name:10s} {'direct':9s} 50 clients: {total / dt:7.1f} alloc+release/s  "
            f"alloc p50 {pct(all_a, 0.5):5.1f} ms p99 {pct(all_a, 0.99):5.1f} ms  "
            f"release p50 {pct(all_r, 0.5):5.1f} ms p99 {pct(all_r, 0.99):5.1f} ms",
            flush=True,
        )
        assert statistics.mean(all_a) > 0
        for rate in rates or []:
            print(f"{db_name:10s} {'direct':9s} {paced(hub.service_url, token, users, rate, 20)}")
    finally:
        hub.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--db", default="sqlite,postgres")
    ap.add_argument(
        "--client",
        choices=["requests", "http.client"],
        default="requests",
        help="the HTTP client the benchmark drives the API with",
    )
    ap.add_argument(
        "--rates",
        default="",
        help="also 50 clients paced at these total cycles/s (comma-separated), 20 s each",
    )
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    global CLIENT
    CLIENT = args.client
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        for db in args.db.split(","):
            if db == "sqlite":
                run("sqlite", None, args.cycles, Path(tmp) / "sqlite", rates)
            elif db == "postgres":
                bindir = find_bindir()
                if bindir is None:
                    print("postgres   (skipped: no PostgreSQL binaries found)")
                    continue
                server = start_server(bindir)
                stack.callback(server.stop)
                url = stack.enter_context(fresh_database(server.url()))
                run("postgres", url, args.cycles, Path(tmp) / "postgres", rates)


if __name__ == "__main__":
    main()
