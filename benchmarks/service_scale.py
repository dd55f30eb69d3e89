"""The real service process at a large site's size, and at 1/4 and 1/16, under its own load.

``scale.py`` calls the service's code in one process; this starts a real JupyterHub and the
gpuslice service (``tests/harness``) over a ledger of 200 hosts x 8 A100s (2 per host in MIG
mode with 7 x 1g.10gb, 6 for shares and whole GPUs), 500 users and 10 000 queued jobs, and
measures it through HTTP while the servers of every held slice send their usage reports
(each every 60 s, spread over the minute, with its owner's token, as the server extension
does).

The ledger is prepared before the service starts (as a site's would be after a restart):
every whole GPU held by a server (so the queue's whole-GPU and share jobs find nothing free
and nothing runs: the local backend would start real runners), 8 of each host's 14 MIG
instances held, and the queued jobs spread over the users and those profiles. The measured
allocations take and give back MIG instances as the hub's spawner does (the service's
token, naming the user); each one wakes the scheduler, which tries the blocked queue again.
The reconciler is off (the held slices' servers exist only in the ledger).

For ``--seconds`` (120) a user's spawn form and a spawn follow one another; reported, in ms:
``api/profiles`` (the spawn form's counts, a user's token) p50/p99; an
allocation and a release p50/p99; the scheduler's passes (the service's own
``gpuslice_scheduler_pass_seconds``: mean, and the bucket its slowest fell in); the event
loop's lag (``gpuslice_event_loop_lag_seconds``: the bucket of the worst, and how many
probes waited over 50 ms); the full garbage collections (``gpuslice_gc_pause_seconds``:
how many, their mean, the bucket of the slowest); a ``/metrics`` scrape and
``api/admin/overview``.

    .venv/bin/python benchmarks/service_scale.py [--sizes 16 4 1] [--seconds 120]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.scale import PROFILES, by_size, hosts  # noqa: E402
from gpuslice_hub.ledger import Caller  # noqa: E402
from tests.harness.hub import start_hub  # noqa: E402
from tests.jobs.full_cluster import insert_queued  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402

REPORT_EVERY = 60.0  # seconds between one server's usage reports (the extension's default)
MIG_HELD_PER_HOST = 8  # of 14: the measured allocations find some free


class Client:
    """One kept-alive connection (``http.client``: little CPU beside the service's)."""

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self.path = url.path.rstrip("/")
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
        self.headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        self.conn.request(method, self.path + path, data, self.headers)
        reply = self.conn.getresponse()
        return reply.status, reply.read()


def prepare(url: str, folder: Path, n_hosts: int, n_users: int, n_jobs: int) -> list[tuple]:
    """The ledger before the service starts; returns the held (allocation id, user)."""
    ledger = build_ledger(url, PROFILES, hosts=hosts(n_hosts), policy="default")
    held: list[tuple[int, str]] = []
    # every whole GPU, then the MIG instances: a slice per user in turn
    wanted = ["gpu-1"] * (6 * n_hosts) + ["mig-1g.10gb"] * (MIG_HELD_PER_HOST * n_hosts)
    for i, profile in enumerate(wanted):
        user = f"r{i % n_users}"
        alloc, _ = ledger.allocate(Caller(user, (), "gpuslice"), profile, f"s{i}")
        held.append((alloc["id"], user))
    blocked = ["gpu-1", "gpu-2", "share-250"]
    specs = [
        (f"r{i % n_users}", blocked[i % len(blocked)], "normal" if i == 0 else "preemptible")
        for i in range(n_jobs)
    ]
    insert_queued(ledger.db, folder, specs)
    ledger.db.dispose()
    return held


def reporter(
    base: str, tokens: dict[str, str], held: list[tuple], stop: threading.Event, sent: list[int]
) -> threading.Thread:
    """Each held slice's server reports every ``REPORT_EVERY`` s, spread over the minute
    (one request at a time: it falls behind when a round trip takes longer than the gap;
    ``sent`` counts what it sent)."""

    def run() -> None:
        clients = {user: Client(base, token) for user, token in tokens.items()}
        gap = REPORT_EVERY / max(1, len(held))
        body = {"utilization": 30, "memory_mib": 1000, "interval_seconds": REPORT_EVERY}
        i, due = 0, time.monotonic()
        while not stop.is_set():
            alloc_id, user = held[i % len(held)]
            status, text = clients[user].call("POST", f"/api/allocations/{alloc_id}/usage", body)
            assert status == 200, text
            sent[0] += 1
            i += 1
            due += gap
            stop.wait(max(0.0, due - time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


def p50_p99(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return f"{values[len(values) // 2]:.0f} / {p99:.0f}"


def histogram(text: str, name: str, labels: str = "") -> tuple[dict[float, float], float, float]:
    """Cumulative bucket counts by upper bound, the count and the sum of a histogram
    (``labels``: the series' other labels, as written, e.g. ``generation="2"``)."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    bucket = f"{name}_bucket{{{labels}," if labels else f"{name}_bucket{{"
    tail = f"{{{labels}}} " if labels else " "
    for line in text.splitlines():
        if line.startswith(bucket):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
        elif line.startswith(f"{name}_count{tail}"):
            count = float(line.split()[-1])
        elif line.startswith(f"{name}_sum{tail}"):
            total = float(line.split()[-1])
    return buckets, count, total


def worst_bucket(before: dict[float, float], after: dict[float, float]) -> str:
    """The bucket the slowest observation between two scrapes fell in, as "lo-hi ms"."""
    lo = 0.0
    for le in sorted(after):
        if after[le] - before.get(le, 0.0) == after[max(after)] - before.get(max(after), 0.0):
            return f"{lo * 1000:g}-{le * 1000:g}"
        lo = le
    return "?"


def measure(n_hosts: int, n_users: int, n_jobs: int, seconds: float, tmp: Path) -> dict[str, str]:
    url = f"sqlite:///{tmp}/gpuslice.sqlite"
    t0 = time.perf_counter()
    held = prepare(url, tmp / "jobs", n_hosts, n_users, n_jobs)
    hub = start_hub(
        tmp / "hub", db_url=url, profiles=PROFILES, hosts=hosts(n_hosts), lean_check=False
    )
    out: dict[str, str] = {}
    stop = threading.Event()
    try:
        tokens = {f"r{i}": hub.add_user(f"r{i}") for i in range(n_users)}
        admin = hub.add_user("admin")
        base = hub.service_url.rstrip("/")
        print(f"  ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        sent = [0]
        thread = reporter(base, tokens, held, stop, sent)
        load_started = time.monotonic()
        scraper = Client(base, admin)

        def scrape() -> str:
            status, text = scraper.call("GET", "/metrics")
            assert status == 200
            return text.decode()

        start = scrape()
        user = Client(base, tokens["r0"])
        spawner = Client(base, hub.service_token)

        def profiles() -> None:
            status, text = user.call("GET", "/api/profiles")
            assert status == 200, text

        allocs: list[float] = []
        releases: list[float] = []

        def cycle() -> None:
            a0 = time.perf_counter()
            status, text = spawner.call(
                "POST",
                "/api/allocations",
                {"user": "r1", "groups": [], "profile": "mig-1g.10gb", "server_name": "bench"},
            )
            a1 = time.perf_counter()
            assert status == 201, text
            status, text = spawner.call("DELETE", f"/api/allocations/{json.loads(text)['id']}")
            allocs.append((a1 - a0) * 1000)
            releases.append((time.perf_counter() - a1) * 1000)
            assert status == 200, text

        # a spawn form and a spawn (allocate, then release) after another, for ``seconds``:
        # the usage reports and the scheduler's passes go on meanwhile
        forms: list[float] = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            forms += timed(profiles, 1)
            cycle()
        out["api/profiles p50/p99"] = p50_p99(forms)
        out["allocate p50/p99"] = p50_p99(allocs)
        out["release p50/p99"] = p50_p99(releases)
        out["spawns measured"] = str(len(allocs))
        middle = scrape()
        out["/metrics scrape p50"] = f"{timed(scrape, 10)[5]:.0f}"

        def overview() -> None:
            status, text = scraper.call("GET", "/api/admin/overview")
            assert status == 200, text

        out["admin overview p50"] = f"{timed(overview, 10)[5]:.0f}"
        end = scrape()
        stop.set()
        thread.join(30)
        minutes = (time.monotonic() - load_started) / 60
        passes_before, n0, s0 = histogram(start, "gpuslice_scheduler_pass_seconds")
        passes_after, n1, s1 = histogram(end, "gpuslice_scheduler_pass_seconds")
        out["scheduler passes"] = f"{n1 - n0:.0f}"
        out["pass mean"] = f"{(s1 - s0) / max(1.0, n1 - n0) * 1000:.0f}"
        out["slowest pass in"] = worst_bucket(passes_before, passes_after)
        for label, first, last in (
            ("spawns and reports", start, middle),
            ("+ /metrics and overview", middle, end),
        ):
            lag_before, l0, _ = histogram(first, "gpuslice_event_loop_lag_seconds")
            lag_after, l1, _ = histogram(last, "gpuslice_event_loop_lag_seconds")
            over = (l1 - lag_after[0.05]) - (l0 - lag_before.get(0.05, 0.0))
            out[f"loop lag, {label}: worst in"] = worst_bucket(lag_before, lag_after)
            out[f"loop lag, {label}: probes over 50 ms"] = f"{over:.0f} of {l1 - l0:.0f}"
        gc_before, g0, gs0 = histogram(start, "gpuslice_gc_pause_seconds", 'generation="2"')
        gc_after, g1, gs1 = histogram(end, "gpuslice_gc_pause_seconds", 'generation="2"')
        out["full garbage collections, mean ms"] = (
            f"{g1 - g0:.0f}, {(gs1 - gs0) / max(1.0, g1 - g0) * 1000:.0f}"
        )
        out["slowest full collection in"] = worst_bucket(gc_before, gc_after) if g1 > g0 else "-"
        out["usage reports a minute: scheduled, sent"] = f"{len(held)}, {sent[0] / minutes:.0f}"
    finally:
        stop.set()
        hub.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 4, 1])
    parser.add_argument(
        "--seconds", type=float, default=120, help="how long each size is measured under load"
    )
    args = parser.parse_args()

    def in_a_temp_dir(n_hosts: int, n_users: int, n_jobs: int) -> dict[str, str]:
        with tempfile.TemporaryDirectory() as tmp:
            return measure(n_hosts, n_users, n_jobs, args.seconds, Path(tmp))

    by_size(args.sizes, in_a_temp_dir)


if __name__ == "__main__":
    main()
