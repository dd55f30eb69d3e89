"""The simulation: one policy, one workload, one virtual clock.

Events (arrivals, the end of a session, a cull, a run's exit) are taken in time order; at
each one the clock is set to its time and the service's own code decides: the ledger
allocates and releases (placement, quotas, preemption of batch jobs for a spawn), the job
scheduler makes its pass (``Scheduler.tick``) whenever the batch side may have changed,
and the server extension's idle tracker and reclaimer decide each session's cull.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from gpuslice.activity.idle import IdleTracker
from gpuslice.extension.decisions import CULLED, WARNING
from gpuslice.extension.reclaim import ExtensionRefused, Reclaimer
from gpuslice.gpu import discover
from gpuslice.idle_policy import PolicyConfig
from gpuslice_hub import clock
from gpuslice_hub.admin.pool import read_pool, totals
from gpuslice_hub.admin.quota_suggestions import SuggestionSettings, quota_suggestions
from gpuslice_hub.admin.usage import FIELDS, store_sample
from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.schema import ensure_schema
from gpuslice_hub.errors import Pending, Refused
from gpuslice_hub.idle import effective_policy, reclaim_record
from gpuslice_hub.jobs.burst import Burst, reason_to_send
from gpuslice_hub.jobs.holder import holder_job
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.jobs.states import PRIORITY_CLASSES
from gpuslice_hub.jobs.windows import parse_windows
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.overcommit import OvercommitHistory, OvercommitSettings
from gpuslice_hub.overrides import AdminSettings
from gpuslice_hub.placement import get_policy
from gpuslice_hub.pools import parse_pools
from gpuslice_hub.profiles import parse_profiles
from gpuslice_hub.quotas import parse_quotas

from .backend import SimBackend
from .policies import PROFILES, Policy, hosts, profile_milli, whole_gpus
from .workload import BatchJob, Session, Workload

# A Monday: the generator's weekdays start here.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
NOTEBOOK = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {},
    "cells": [
        {
            "cell_type": "code",
            "id": "c1",
            "metadata": {},
            "source": "train()",
            "outputs": [],
            "execution_count": None,
        }
    ],
}


@dataclass(frozen=True)
class Settings:
    """How people and the runner behave, the same under every policy."""

    n_hosts: int = 25
    mig_hosts: int = 2  # hosts in MIG mode, where the policy offers slices
    spawn_timeout: float = 300.0  # how long a spawn waits for a slice being freed
    retry_after_refusal: float = 300.0  # a refused person tries again this much later
    give_up_after: float = 3600.0  # ... and gives up after asking for this long
    keep_alive_share: float = 0.2  # a warned person clicks "keep working" this often
    window: float = 30.0  # the idle tracker's window (server extension's default)
    # jupyterhub-idle-culler's check interval (None: its default, half its timeout)
    culler_every: float | None = None
    preempt_grace: float = 60.0
    exit_delay: float = 10.0  # a preempted job exits this long after the signal
    sample_every: float = 1800.0  # the time series' step
    batch_users_max_jobs: int = 100000  # no per-user job cap in the way of the trace


@dataclass
class Request:
    """One time a session asked for a slice (its first spawn, or again after a cull)."""

    session: int
    asked: float
    granted: float | None = None
    refusals: int = 0
    gave_up: bool = False
    gave_up_at: float | None = None  # (its wait, for the wait figures: issue 47)


@dataclass
class Live:
    session: Session
    profile: str
    stretch: int  # the stretch it plays from when granted
    request: Request
    alloc: dict[str, Any] | None = None
    since: float = 0.0  # when the current grant began (playing stretch ``stretch``)


@dataclass
class Result:
    policy: Policy
    horizon: float
    capacity_milli: int
    requests: list[Request] = field(default_factory=list)
    interactive_useful: float = 0.0  # milli-GPU-seconds of work done in sessions
    interactive_lost: float = 0.0  # ... killed by a cull before it finished
    batch_useful: float = 0.0
    batch_lost: float = 0.0
    batch_jobs: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # seconds of work each stopped run lost
    samples: list[dict[str, Any]] = field(default_factory=list)
    allocated_milli_seconds: float = 0.0
    reclaimed_gpu_hours: float = 0.0
    # the admin panel's capacity check over the simulated ledger at the end
    capacity_check: dict[str, Any] | None = None
    culls: int = 0
    warnings: int = 0
    keep_alives: int = 0
    # defragmentation: jobs moved, and the milli-GPUs they held (JobManager's counters)
    moved_jobs: int = 0
    moved_milli: int = 0
    # overcommit: shares granted, how many charged less than they promise, and grants after
    # which the holders of that GPU would, at their peaks, use more memory than it has
    share_grants: int = 0
    overcommitted_grants: int = 0
    memory_collisions: int = 0
    # milli-GPU-seconds of compute the holders of a GPU asked beyond its 1000 at once
    # (estimated at each sample): time slicing divides it, so it is not extra work done
    contention_milli_seconds: float = 0.0
    # burst: per job sent, when (seconds), when it ends there, and the GPU-seconds bought
    bursts: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    # quota suggestions: quotas applied, and people's requests refused over their quota
    quotas_applied: int = 0
    quota_refusals: int = 0
    wall_seconds: float = 0.0
    # the busy GPU work the workload offers inside the horizon (measure.demand), the most
    # any scheduler could get done on it
    demand_milli_seconds: float = 0.0


# A run's own folder goes to memory where there is room: its ledger commits and job folders
# are scratch, and on this project's 2-core VM their disk writes (SQLite's syncs, three files
# a submitted job) were a third of a simulated day's time (docs/benchmarks.md).
RAM_FOLDER = "/dev/shm"
RAM_FOLDER_FREE = 4 << 30  # bytes: a month of policy 4 leaves ~600 MB there


def scratch() -> str | None:
    """Where a run makes its own folder: ``TMPDIR`` when set, else a RAM-backed ``/dev/shm``
    with room to spare, else the system's temporary folder (None)."""
    if os.environ.get("TMPDIR") or not os.path.isdir(RAM_FOLDER):
        return None
    try:
        if os.access(RAM_FOLDER, os.W_OK) and shutil.disk_usage(RAM_FOLDER).free >= RAM_FOLDER_FREE:
            return RAM_FOLDER
    except OSError:
        pass
    return None


def _profiles(p: Policy, workload: Workload) -> dict[str, Any]:
    """The profile set a simulation's ledger offers: the simulator's catalog, the site's
    own profiles a replayed history asks for, and the policy's share menu (each name
    once: the first)."""
    catalog: dict[str, dict[str, Any]] = {}
    for pr in [*PROFILES, *workload.profiles, *p.share_profiles()]:
        catalog.setdefault(pr["name"], pr)
    return parse_profiles([{**pr, "idle_timeout": int(p.idle_timeout)} for pr in catalog.values()])


def _cluster(p: Policy, s: Settings, workload: Workload) -> list[dict[str, Any]]:
    if workload.hosts is not None:
        return whole_gpus(workload.hosts) if not p.slices else workload.hosts
    return hosts(s.n_hosts, s.mig_hosts if p.slices else 0)


def _pools(p: Policy, inventory: Any) -> Any:
    """The policy's split pools (JobManager.reserved_pools), None without: the service's
    own, parsed and checked against the inventory."""
    n_reserved, borrow = p.reserved_pool()
    if not n_reserved:
        return None
    names = sorted(h.name for h in inventory.hosts)
    if n_reserved > len(names):
        raise ValueError(f"reserved: {n_reserved} hosts reserved, but the cluster has {len(names)}")
    windows = parse_windows({"borrow": borrow}, "UTC") if borrow else {}
    pools = parse_pools(
        {"people": {"hosts": names[:n_reserved]}},
        "borrow" if borrow else "",
        windows,
        reserved_priority=100 * PRIORITY_CLASSES["high"],
    )
    assert pools is not None
    pools.check_inventory((g.host, g.uuid) for h in inventory.hosts for g in h.gpus)
    return pools


def _idle_config(p: Policy) -> PolicyConfig:
    return PolicyConfig.parse(
        {"action": "server", "idle_timeout": p.idle_timeout, "warning_lead": p.warning_lead}
    )


def check(workload: Workload, policy: Policy, settings: Settings) -> None:
    """Build ``policy``'s configuration on ``workload``'s cluster as a simulation would
    (profiles, placement, time windows, pools, idle policy), without simulating: a
    setting the service would refuse raises here (ValueError, or the service's
    ConfigError), before any simulation starts."""
    profiles = _profiles(policy, workload)
    asked = {s.profile for s in workload.sessions} | {j.profile for j in workload.jobs}
    unknown = sorted(asked - set(profiles))
    if unknown:
        raise ValueError(f"the workload asks for profile {unknown[0]!r}, which no profile set has")
    get_policy(policy.placement)
    inventory = discover("simulated", _cluster(policy, settings, workload))
    if policy.batch_window:
        parse_windows({"batch": policy.batch_window.split(";")}, "UTC")
    _pools(policy, inventory)
    _idle_config(policy)


class Simulation:
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        settings: Settings | None = None,
        seed: int = 0,
        folder: Path | None = None,
        database: str | None = None,
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.settings = settings or Settings()
        self.rng = random.Random(seed)
        # a folder of its own is removed when the run ends: a month of the seeds' case
        # leaves a ledger and 35 000 job folders (600 MB) there
        self._own_folder = folder is None
        self.folder = folder or Path(tempfile.mkdtemp(prefix="gpuslice-sim-", dir=scratch()))
        self.horizon = workload.days * 86400.0
        self.clock = clock.ManualClock(EPOCH)
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.t = 0.0
        self._ticks: set[float] = set()
        self.database = database or f"sqlite:///{self.folder}/ledger.sqlite"

    # -- set-up ----------------------------------------------------------------------------

    def _build(self) -> None:
        s, p = self.settings, self.policy
        db = open_database(self.database)
        ensure_schema(db, "gpuslice-sim")
        self.ledger = Ledger(
            db, _profiles(p, self.workload), parse_quotas({}), get_policy(p.placement)
        )
        inventory = discover("simulated", _cluster(p, s, self.workload))
        self.ledger.sync_inventory(inventory)
        self.capacity_milli = 1000 * sum(len(h.gpus) for h in inventory.hosts)
        self.gpu_memory = {g.uuid: g.memory_mib for h in inventory.hosts for g in h.gpus}
        # the most memory each share allocation's session uses (MiB), by allocation id
        self.peak_mib: dict[int, float] = {}
        overcommit = p.overcommit_settings()
        if overcommit is not None:
            # the service's own overcommit, charging from the usage reports the sessions send
            ratio, min_hours = overcommit
            self.ledger.overcommit = OvercommitHistory(
                OvercommitSettings(ratio=ratio, min_hours=min_hours)
            )
        self.jobs_by_id: dict[int, BatchJob] = {}
        self.backend = SimBackend(
            self.jobs_by_id, self.now, self._tick_at, EPOCH.timestamp(), s.exit_delay
        )
        manager = JobManager(self.ledger, db, self.backend, self.folder / "jobs")  # type: ignore[arg-type]
        manager.run_jobs_as_service_user = True  # the simulated users have no accounts
        manager.preempt_grace = s.preempt_grace
        manager.max_jobs_per_user = s.batch_users_max_jobs
        manager.max_runtime_limit = 7 * 86400.0
        manager.defragment_moves_per_hour = p.defrag
        manager.log.setLevel(logging.ERROR)
        if p.batch_window:
            # the service's own windows: parsed and enforced by its manager and scheduler
            manager.windows = parse_windows({"batch": p.batch_window.split(";")}, "UTC")
            manager.class_time_windows = {p.batch: "batch"}
        manager.pools = _pools(p, inventory)
        if manager.pools is not None:
            self.ledger.pools = manager.pools
        self.manager = manager
        self.burst: Burst | None = None
        burst = p.burst_settings()
        if burst is not None:
            # the service's own decision (burst.py); the engine's side, a second partition
            # without limit, is the simulator's
            manager.burst_partition = "burst"
            manager.burst_after_wait, manager.burst_when_allocated_above = burst
            self.burst = Burst(manager, manager.log)
        self.ledger.preempt_hook = manager.preempt_for_interactive
        self.ledger.spawn_preemption = manager.spawn_preemption
        self.scheduler = Scheduler(manager)
        self.idle_config = _idle_config(p)

    # -- the event loop --------------------------------------------------------------------

    def _at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        # in whole microseconds, the clock's resolution: what the service reads as now is
        # then exactly the event's time. Never before now: a time worked out from what the
        # service said a moment ago (when the queue is next due, a backoff's end) may have
        # passed; it is due now (issue 47: such an event stopped a run with "time cannot
        # go back").
        self._seq += 1
        heapq.heappush(self._events, (max(round(t, 6), self.t), self._seq, fn, args))

    def _tick_at(self, t: float) -> None:
        """A scheduler pass at ``t`` (one per instant, after that instant's other events)."""
        t = round(t, 6)
        if t not in self._ticks and t < self.horizon:
            self._ticks.add(t)
            self._at(t, self._tick)

    def _window_edges(self) -> list[float]:
        """Seconds into the run at which a batch time window opens or closes."""
        edges: list[float] = []
        end = EPOCH + timedelta(seconds=self.horizon)
        windows = list(self.manager.windows.values())
        if self.manager.pools is not None and self.manager.pools.borrow_window is not None:
            # the scheduler returns borrowed slices at the close
            windows.append(self.manager.pools.borrow_window)
        for window in windows:
            at = EPOCH
            while at < end:
                nxt = window.opens_at(at) or window.closes_at(at)
                if nxt is None or nxt >= end:
                    break
                edges.append((nxt - EPOCH).total_seconds())
                at = nxt
        return edges

    def now(self) -> float:
        """The simulation's time: seconds since it started."""
        return self.t

    def run(self) -> Result:
        import time

        started = time.perf_counter()
        try:
            self._run()
        finally:
            if self._own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)
        self.result.wall_seconds = time.perf_counter() - started
        return self.result

    def _run(self) -> None:
        with clock.installed(self.clock):
            self._build()
            self.result = Result(self.policy, self.horizon, self.capacity_milli)
            self.live: dict[int, Live] = {}
            self.asking: dict[int, Request] = {}  # requests not granted nor given up yet
            for session in self.workload.sessions:
                if session.arrival < self.horizon:
                    req = Request(session.id, round(session.arrival, 6))
                    live = Live(session, self.policy.profile(session.profile), 0, req)
                    self._at(session.arrival, self._spawn, live)
            for job in self.workload.jobs:
                if job.arrival < self.horizon:
                    self._at(job.arrival, self._submit, job)
            t = 0.0
            while t < self.horizon:
                self._at(t, self._sample)
                t += self.settings.sample_every
            if self.burst is not None:
                self._at(0.0, self._burst_check)
            if self.policy.quotas:
                self._at(self.policy.quotas * 86400.0, self._apply_quota_suggestions)
            for edge in self._window_edges():
                # a pass when a window opens or closes, as the service's loop would run one
                self._tick_at(edge)
            while self._events:
                t, _, fn, args = heapq.heappop(self._events)
                if t >= self.horizon:
                    break
                self.t = t
                self.clock.set(EPOCH + timedelta(seconds=t))
                fn(*args)
            self.t = self.horizon
            self.clock.set(EPOCH + timedelta(seconds=self.horizon))
            self._finish()
            self.result.moved_jobs = self.manager.moved_jobs
            self.result.moved_milli = self.manager.moved_milli
            self.ledger.db.dispose()

    def _tick(self) -> None:
        t = self.now()
        self._ticks.discard(t)
        self.backend.settle(t)
        self.scheduler.tick(self.clock.now())
        due = self.scheduler._next_due
        if due is not None:
            self._tick_at((due - EPOCH).total_seconds())

    # -- batch -------------------------------------------------------------------------------

    def _submit(self, job: BatchJob) -> None:
        caller = Caller(job.user, (job.group,), job.user)
        body = {
            "name": f"job{job.id}",
            "notebook": NOTEBOOK,
            "profile": self.policy.batch_profile(job),
            "slices": job.slices,
            "priority": self.policy.batch,
            "checkpoint_interval": job.checkpoint_interval,
            "max_runtime": 7 * 86400.0,
        }
        out = self.manager.submit(caller, body)
        self.jobs_by_id[int(out["id"])] = job
        self._tick_at(self.now())

    def _burst_check(self) -> None:
        """Every minute (the service's pass asks every second): each queued job the
        service's burst decision would send leaves this cluster's queue and runs at once on
        bought capacity, its remaining work from its last checkpoint."""
        assert self.burst is not None
        now, at = self.now(), self.clock.now()
        high = self.burst.high(at)
        with self.manager.db.reading() as s:
            queued = set(s.scalars(select(JobRow.id).where(JobRow.state == "queued")))
            since = dict(
                s.execute(
                    select(JobTransitionRow.job_id, func.max(JobTransitionRow.at))
                    .where(JobTransitionRow.state == "queued")
                    .group_by(JobTransitionRow.job_id)
                ).all()
            )
        for job_id in sorted(queued):
            job = self.jobs_by_id.get(job_id)
            if job is None or job_id not in since:
                continue
            why = reason_to_send(
                at - since[job_id],
                job.work,  # the user's estimate of its run time, taken as exact
                self.manager.burst_after_wait,
                high,
                self.manager.burst_when_allocated_above,
            )
            if not why:
                continue
            left = job.work - self.backend.saved.get(job_id, 0.0)
            self.manager.cancel(job_id, "burst", f"sent to the burst partition: {why}")
            held = profile_milli(self.policy.batch_profile(job)) * job.slices / 1000
            self.result.bursts[job_id] = (now, now + left, left * held)
        if now + 60 < self.horizon:
            self._at(now + 60, self._burst_check)

    def _apply_quota_suggestions(self) -> None:
        """The admin panel's quota suggestions over the days so far, each applied as its
        Apply button does (users' and groups'); the scheduler's next pass sees them."""
        settings = SuggestionSettings(days=self.policy.quotas)
        with self.ledger.db.reading() as s:
            quotas = self.ledger.effective_quotas(s)
        found = quota_suggestions(self.ledger, quotas, settings, self.clock.now())
        admin = AdminSettings(self.ledger.db)
        for row in found["suggestions"]:
            suggested = row["suggested"]
            if suggested is None or row["change"] in (None, "same"):
                continue
            admin.set_quota(
                row["subject"],
                row["name"],
                suggested.get("max_slices"),
                suggested.get("max_milli"),
                "gpuslice-sim",
                "applied the suggestion",
            )
            self.result.quotas_applied += 1
        self._tick_at(self.now())

    # -- interactive sessions ----------------------------------------------------------------

    def _spawn(self, live: Live) -> None:
        s, now = live.session, self.now()
        self.asking[id(live.request)] = live.request
        caller = Caller(s.user, (s.group,), s.user)
        try:
            alloc, _ = self.ledger.allocate(
                caller, live.profile, f"s{s.id}", wait_seconds=self.settings.spawn_timeout
            )
        except Pending as e:
            # a batch job checkpoints to free the slice: the spawner asks again soon
            self._tick_at(now)
            retry = float(e.detail.get("retry_after", 1) or 1)  # type: ignore[arg-type]
            self._at(now + retry, self._spawn, live)
            return
        except Refused as e:
            if e.code not in ("no_capacity", "over_quota"):
                raise
            live.request.refusals += 1
            self.result.quota_refusals += e.code == "over_quota"
            again = now + self.settings.retry_after_refusal
            if again - live.request.asked > self.settings.give_up_after:
                live.request.gave_up = True
                live.request.gave_up_at = now
                self.result.requests.append(live.request)
                self.asking.pop(id(live.request), None)
                return
            self._at(again, self._spawn, live)
            return
        live.alloc, live.since = alloc, now
        live.request.granted = now
        if alloc["kind"] == "share":
            self._share_granted(live, alloc)
        self.result.requests.append(live.request)
        self.asking.pop(id(live.request), None)
        self.live[s.id] = live
        cull = self._cull_time(live)
        end = now + sum(st.seconds for st in s.stretches[live.stretch :])
        if cull is not None and cull[0] < end:
            self._at(cull[0], self._cull, live, cull[1])
        else:
            self._at(end, self._stop, live)

    def _played(self, live: Live, until: float) -> tuple[float, float, int, float]:
        """(useful, lost) milli-GPU-seconds of the stretches played from the grant to
        ``until``, the stretch playing at ``until``, and when that stretch began."""
        t, useful = live.since, 0.0
        stretches = live.session.stretches
        gpus = live.session.gpus
        for k in range(live.stretch, len(stretches)):
            st = stretches[k]
            if t + st.seconds > until:
                # cut here: the part of an active stretch played so far did not finish
                lost = gpus * st.busy_milli * (min(until, self.horizon) - t) if st.active else 0.0
                return useful, max(lost, 0.0), k, t
            useful += gpus * st.busy_milli * max(0.0, min(t + st.seconds, self.horizon) - t)
            t += st.seconds
        return useful, 0.0, len(stretches), t

    def _stop(self, live: Live) -> None:
        """The person stops their server: the spawner releases the slice."""
        useful, _, _, _ = self._played(live, self.now())
        self.result.interactive_useful += useful
        self._release(live, "server stopped")

    def _share_granted(self, live: Live, alloc: dict[str, Any]) -> None:
        """Count a granted share, whether it is overcommitted, and whether the holders of its
        GPU would now, each at its peak, use more memory than the GPU has (batch jobs'
        shares count at their whole cap: nothing better is known of their memory)."""
        (claim,) = alloc["assignments"]
        cap = claim["memory_mib"]
        self.peak_mib[alloc["id"]] = live.session.peak_memory_share * cap
        self.result.share_grants += 1
        self.result.overcommitted_grants += claim.get("charged_milli") is not None
        gpu = claim["gpu_uuid"]
        used = 0.0
        for a in self.ledger.snapshot()[2]:
            for c in a.claims:
                if c.active and c.gpu_uuid == gpu:
                    used += self.peak_mib.get(a.id, c.memory_mib)
        if used > self.gpu_memory[gpu]:
            self.result.memory_collisions += 1

    def _release(self, live: Live, reason: str) -> None:
        assert live.alloc is not None
        peak = self.peak_mib.pop(live.alloc["id"], None)
        if peak is not None and self.policy.overcommit:
            # the peak its server extension reported while it held the slice
            self.ledger.record_usage(live.alloc["id"], None, peak, 0.0, 60.0)
        self.ledger.release(live.alloc["id"], live.session.user, reason, server_stopped=True)
        live.alloc = None
        self.live.pop(live.session.id, None)
        self._tick_at(self.now())

    def _cull(self, live: Live, idle_seconds: float) -> None:
        now = self.now()
        assert live.alloc is not None
        useful, lost, k, began = self._played(live, now)
        self.result.interactive_useful += useful
        self.result.interactive_lost += lost
        self.result.culls += 1
        # as the reclaim API records it, then the hub stops the server and its spawner
        # releases the slice
        kind, detail = reclaim_record(live.alloc, idle_seconds, voluntary=False)
        self.ledger.record_event(kind, live.session.user, live.session.user, "idle", detail)
        self._release(live, "server stopped")
        # The person comes back for the next active stretch and asks again.
        stretches = live.session.stretches
        t = began + stretches[k].seconds
        for j in range(k + 1, len(stretches)):
            if stretches[j].active:
                request = Request(live.session.id, round(t, 6))
                again = Live(live.session, live.profile, j, request)
                if t < self.horizon:
                    self._at(t, self._spawn, again)
                return
            t += stretches[j].seconds

    def _cull_time(self, live: Live) -> tuple[float, float] | None:
        """When this grant's server is culled, and after how long idle, or None."""
        if self.policy.reclaim == "gpu":
            return self._gpu_reclaim(live)
        if self.policy.reclaim == "inactivity":
            return self._inactivity_cull(live)
        return None

    def _gpu_reclaim(self, live: Live) -> tuple[float, float] | None:
        """The server extension's own tracker and reclaimer, fed each window with the
        session's utilization (the sampler's reading) over its stretches."""
        s = live.session
        policy = effective_policy(
            self.idle_config, self.ledger.profiles, s.user, (s.group,), live.profile, None
        )
        tracker = IdleTracker(self.settings.window)
        reclaimer = Reclaimer(policy)
        t0 = EPOCH.timestamp()
        t = live.since
        window = self.settings.window
        for st in s.stretches[live.stretch :]:
            end = t + st.seconds
            if st.active:
                util = 100.0 * st.busy_milli / 1000
                for at in (t, end - 1e-3):
                    state = tracker.observe(t0 + at, util, memory_bytes=1)
                    reclaimer.observe(t0 + at, {"k": state}, {"k": True})
            else:
                at = t
                while at < end:
                    state = tracker.observe(t0 + at, 0.0, memory_bytes=1)
                    for d in reclaimer.observe(t0 + at, {"k": state}, {"k": False}):
                        if d.action == WARNING:
                            # (decided ahead: counted only if it happens in the simulation)
                            seen = at < self.horizon
                            self.result.warnings += seen
                            if self.rng.random() < self.settings.keep_alive_share:
                                try:
                                    reclaimer.extend(["k"], None, t0 + at)
                                    self.result.keep_alives += seen
                                except ExtensionRefused:
                                    pass  # the admin's maximum is used up: the lab says so
                        elif d.action == CULLED:
                            return at, d.idle_seconds
                    at += window
            t = end
        return None

    def _inactivity_cull(self, live: Live) -> tuple[float, float] | None:
        """jupyterhub-idle-culler: a server whose last activity (a kernel executing, the
        person in the page) is older than the timeout at one of its checks is stopped. GPU
        work outside the kernel is no activity to it."""
        timeout = self.policy.idle_timeout
        every = self.settings.culler_every or timeout // 2
        last = t = live.since
        for st in live.session.stretches[live.stretch :]:
            end = t + st.seconds
            if st.active and st.visible:
                last = end
            else:
                # the culler checks every ``every`` seconds from its own start (the
                # simulation's): the first check at or after ``last + timeout`` culls
                due = last + timeout
                check = every * -(-due // every)
                if check < end and check >= t:
                    return check, check - last
            t = end
        return None

    # -- measurements ------------------------------------------------------------------------

    def _busy_now(self, at: float) -> int:
        busy = 0
        for live in self.live.values():
            t = live.since
            for st in live.session.stretches[live.stretch :]:
                if t + st.seconds > at:
                    busy += st.busy_milli * live.session.gpus
                    break
                t += st.seconds
        runs = self.backend.progress(at)
        for job_id in runs:
            job = self.jobs_by_id[job_id]
            busy += job.busy_total
        return busy

    def _contention(self, at: float) -> int:
        """Milli-GPU asked of shared GPUs beyond their 1000 at ``at`` (overcommitted shares
        can together keep more than a GPU busy; time slicing divides it among them)."""
        sessions = {live.alloc["id"]: live for live in self.live.values() if live.alloc}
        running = self.backend.progress(at)
        asked: dict[str, int] = {}
        for a in self.ledger.snapshot()[2]:
            if a.kind != "share":
                continue
            busy = 0
            live = sessions.get(a.id)
            if live is not None:
                t = live.since
                for st in live.session.stretches[live.stretch :]:
                    if t + st.seconds > at:
                        busy = st.busy_milli
                        break
                    t += st.seconds
            elif (job_id := holder_job(a.server_name)) is not None and job_id in running:
                busy = self.jobs_by_id[job_id].busy_milli
            for c in a.claims:
                asked[c.gpu_uuid] = asked.get(c.gpu_uuid, 0) + busy
        return sum(max(0, milli - 1000) for milli in asked.values())

    def _sample(self) -> None:
        now = self.now()
        figures = totals(read_pool(self.ledger), self.clock.now())
        busy = self._busy_now(now)
        if self.policy.overcommit:
            self.result.contention_milli_seconds += (
                self._contention(now) * self.settings.sample_every
            )
        self.result.samples.append(
            {
                "t": now,
                "allocated": figures["allocated_milli"],
                "interactive": figures["interactive_milli"],
                "batch": figures["batch_milli"],
                "fragmented": figures["fragmented_milli"],
                "queued_jobs": figures["queued_jobs"],
                "running_jobs": figures["running_jobs"],
                "busy": busy,
            }
        )
        # the ledger's own usage samples, for the capacity check at the end: what the
        # service's sampler would store if every holder reported its use exactly
        stored = {k: figures[k] for k in FIELDS}
        stored.update(used_milli=busy, reported_milli=figures["allocated_milli"])
        store_sample(self.ledger, self.clock.now(), stored)

    def _finish(self) -> None:
        from .measure import finish

        finish(self)
