"""Prometheus metrics, computed from the ledger at scrape time (so they survive restarts)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from .admin.capacity_check import CapacityCheckCache
from .admin.history import IDLE_KINDS, IdleTotals, pruned_through, pruned_totals
from .admin.pool import read_pool
from .admin.reports import is_fresh, used_milli
from .admin.split_pools import USES, pool_standing
from .db.jobs_models import JobRow
from .db.models import EventRow, utcnow
from .jobs.manager import JobManager
from .jobs.states import ACTIVE
from .ledger import Ledger
from .snapshot import taken


class LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        hosts, gpus, active = self.ledger.snapshot()
        present = {h.name for h in hosts if h.present}
        gpu_total = GaugeMetricFamily(
            "gpuslice_gpus", "GPUs in the inventory", labels=["host", "model", "mig_mode"]
        )
        per_gpu: Counter[tuple[str, str, str]] = Counter(
            (g.host, g.model, g.mig_mode) for g in gpus if g.present and g.host in present
        )
        for key, n in sorted(per_gpu.items()):
            gpu_total.add_metric(list(key), n)
        yield gpu_total

        milli_total = GaugeMetricFamily(
            "gpuslice_gpu_milli_capacity", "GPU capacity in milli-GPU", labels=["host"]
        )
        milli_used = GaugeMetricFamily(
            "gpuslice_gpu_milli_allocated", "Allocated GPU capacity in milli-GPU", labels=["host"]
        )
        cap: Counter[str] = Counter()
        for g in gpus:
            if g.present:
                cap[g.host] += 1000
        used: Counter[str] = Counter()
        for a in active:
            used[a.host] += a.gpu_milli
        for host in sorted(set(cap) | set(used)):
            milli_total.add_metric([host], cap[host])
            milli_used.add_metric([host], used[host])
        yield milli_total
        yield milli_used

        mig_total = GaugeMetricFamily(
            "gpuslice_mig_instances", "MIG instances in the inventory", labels=["host", "profile"]
        )
        mig_held = GaugeMetricFamily(
            "gpuslice_mig_instances_allocated", "MIG instances held", labels=["host", "profile"]
        )
        held_uuids = {c.mig_uuid for a in active for c in a.claims if c.active and c.mig_uuid}
        totals: Counter[tuple[str, str]] = Counter()
        helds: Counter[tuple[str, str]] = Counter()
        for g in gpus:
            for m in g.mig_instances:
                if m.present:
                    totals[(g.host, m.profile)] += 1
                    helds[(g.host, m.profile)] += m.uuid in held_uuids
        for mkey in sorted(totals):
            mig_total.add_metric(list(mkey), totals[mkey])
            mig_held.add_metric(list(mkey), helds[mkey])
        yield mig_total
        yield mig_held

        slices_total = GaugeMetricFamily(
            "gpuslice_profile_slices",
            "Slices of each profile the cluster holds when empty",
            labels=["profile"],
        )
        slices_free = GaugeMetricFamily(
            "gpuslice_profile_slices_free",
            "Slices of each profile that could be placed now",
            labels=["profile"],
        )
        for name, (free, total) in sorted(self.ledger.profile_capacity().items()):
            slices_total.add_metric([name], total)
            slices_free.add_metric([name], free)
        yield slices_total
        yield slices_free

        by_profile = GaugeMetricFamily(
            "gpuslice_allocations_active",
            "Active allocations",
            labels=["profile", "host", "purpose"],
        )
        for key, n in sorted(Counter((a.profile, a.host, a.purpose) for a in active).items()):
            by_profile.add_metric(list(key), n)
        yield by_profile

        by_user = GaugeMetricFamily(
            "gpuslice_user_allocations", "Active allocations per user", labels=["user"]
        )
        user_milli = GaugeMetricFamily(
            "gpuslice_user_gpu_milli", "Allocated milli-GPU per user", labels=["user"]
        )
        # one walk over the allocations, not one per user (500 users x 4 400 slices)
        counts: Counter[str] = Counter()
        milli: Counter[str] = Counter()
        for a in active:
            counts[a.user] += 1
            milli[a.user] += a.gpu_milli
        for user, n in sorted(counts.items()):
            by_user.add_metric([user], n)
            user_milli.add_metric([user], milli[user])
        yield by_user
        yield user_milli

        by_group = GaugeMetricFamily(
            "gpuslice_group_allocations",
            "Active allocations per charged group",
            labels=["group"],
        )
        for group, n in sorted(Counter(a.charged_group or "" for a in active).items()):
            if group:
                by_group.add_metric([group], n)
        yield by_group


class IdleReclaimCollector(Collector):
    """Idle warnings, keep-alives and culls, and the GPU-hours culls gave back, counted
    from the recorded events (so the counters survive restarts of the service).

    The counts are kept and each scrape reads only the events recorded since the last one:
    a scrape costs what happened in between, not the whole history (the first after a
    start reads it once). Events commit in id order (ledger writes take the ledger lock
    one at a time), so none lands below the id a scrape has read up to. Events pruned by
    history retention count through their totals (``admin/history.py``).
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()
        self._seen: IdleTotals | None = None
        self._pruned_through = -1

    def _catch_up(self) -> IdleTotals:
        with self.ledger.history_lock, self.ledger.db.reading() as s:
            through = pruned_through(s)
            if self._seen is None or through != self._pruned_through:
                # first scrape, or history was pruned since: start again from the totals
                self._seen, self._pruned_through = pruned_totals(s), through
            seen = self._seen
            rows = s.execute(
                select(EventRow.id, EventRow.kind, EventRow.profile, EventRow.detail)
                .where(EventRow.id > seen.through, EventRow.kind.in_(IDLE_KINDS))
                .order_by(EventRow.id)
            )
            for event_id, kind, profile, detail in rows:
                seen.through = event_id
                seen.add(kind, profile or "", detail)
            return seen.copy()

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            seen = self._catch_up()
        events, hours = seen.counts, seen.hours_by_profile()
        family = CounterMetricFamily(
            "gpuslice_idle_events",
            "Idle-reclaim events: warnings, keep-alives, culls (kind idle-culled), memory-cap "
            "warnings and culls; scope is kernel or server",
            labels=["kind", "profile", "scope"],
        )
        for key, n in sorted(events.items()):
            family.add_metric(list(key), n)
        yield family
        culls = CounterMetricFamily(
            "gpuslice_idle_culls", "Idle culls (kernels and servers)", labels=["profile", "scope"]
        )
        for (kind, profile, scope), n in sorted(events.items()):
            if kind == "idle-culled":
                culls.add_metric([profile, scope], n)
        yield culls
        reclaimed = CounterMetricFamily(
            "gpuslice_reclaimed_gpu_hours",
            "GPU-hours given back by idle server culls: the slice's GPU share times the idle "
            "time that ended with the cull",
            labels=["profile"],
        )
        for profile, h in sorted(hours.items()):
            reclaimed.add_metric([profile], h)
        yield reclaimed


class PoolCollector(Collector):
    """What the admin panel's summary shows, per host: utilized (from the holders' current
    usage reports), the allocation those reports cover, and fragmented free capacity."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = read_pool(self.ledger)
        now = utcnow()
        hosts = sorted(h.name for h in pool.inventory.hosts if h.present)
        utilized: Counter[str] = Counter()
        reported: Counter[str] = Counter()
        for a in pool.active:
            report = pool.reports.get(a.id)
            if report is not None and is_fresh(report, now):
                utilized[a.host] += used_milli(a, report.utilization)
                reported[a.host] += a.gpu_milli
        host_of = {g.uuid: g.host for g in pool.inventory.gpus}
        fragmented: Counter[str] = Counter()
        for uuid, milli in pool.fragmented.items():
            fragmented[host_of.get(uuid, "")] += milli
        for name, help_text, values in (
            (
                "gpuslice_gpu_milli_utilized",
                "GPU capacity in milli-GPU kept busy, from the holders' current usage reports",
                utilized,
            ),
            (
                "gpuslice_gpu_milli_reported",
                "Allocated milli-GPU covered by a current usage report (utilized is out of this)",
                reported,
            ),
            (
                "gpuslice_gpu_milli_fragmented",
                "Free milli-GPU that no configured profile can use now",
                fragmented,
            ),
        ):
            family = GaugeMetricFamily(name, help_text, labels=["host"])
            for host in hosts:
                family.add_metric([host], values[host])
            yield family


class CapacityCheckCollector(Collector):
    """The capacity check's figures over 7 and 30 days (read from its cache, which recomputes
    at most once per sampling interval: a scrape never rescans the history itself)."""

    FIGURES = (
        (
            "gpuslice_capacity_allocation_ratio",
            "allocation_rate",
            "Sum of allocated over sum of GPU capacity (drained GPUs included) over the "
            "window's usage samples",
        ),
        (
            "gpuslice_capacity_effective_utilization_ratio",
            "effective_utilization",
            "Sum of used over sum of GPU capacity over the window's usage samples whose use "
            "is known",
        ),
        (
            "gpuslice_capacity_reported_busy_ratio",
            "busy_share",
            "Sum of used over sum of the allocation usage reports covered (how busy reporting "
            "holders keep what they hold)",
        ),
        (
            "gpuslice_capacity_queue_to_run_ratio",
            "queue_to_run",
            "Median batch queue time over median run time of the window's jobs",
        ),
    )

    def __init__(self, cache: CapacityCheckCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        check = self.cache.get(utcnow())
        for name, key, help_text in self.FIGURES:
            family = GaugeMetricFamily(name, help_text, labels=["window"])
            for w in check["windows"]:
                if w[key] is not None:  # unknown is not 0: no sample says nothing
                    family.add_metric([f"{w['days']}d"], w[key])
            yield family


class TimeWindowCollector(Collector):
    """Each batch time window: open or not, and how many queued jobs are limited to it."""

    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = utcnow()
        with self.jobs.db.reading() as s:
            counts = dict(
                s.execute(
                    select(JobRow.time_window, func.count())
                    .where(JobRow.state == "queued", JobRow.time_window.is_not(None))
                    .group_by(JobRow.time_window)
                ).all()
            )
        is_open = GaugeMetricFamily(
            "gpuslice_time_window_open", "1 while the batch time window is open", labels=["window"]
        )
        queued = GaugeMetricFamily(
            "gpuslice_jobs_queued_in_window",
            "Queued batch jobs limited to the time window (waiting for it while it is closed)",
            labels=["window"],
        )
        for name, window in sorted(self.jobs.windows.items()):
            is_open.add_metric([name], 1 if window.is_open(now) else 0)
            queued.add_metric([name], counts.get(name, 0))
        yield is_open
        yield queued


class DefragCollector(Collector):
    """Jobs moved by defragmentation since the service started."""

    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "gpuslice_defrag_jobs_moved",
            "Preemptible jobs checkpointed and moved to make room for a job whose free "
            "capacity was split across GPUs (since the service started)",
            value=self.jobs.moved_jobs,
        )
        yield CounterMetricFamily(
            "gpuslice_defrag_moved_milli",
            "Milli-GPUs the moved jobs held (since the service started)",
            value=self.jobs.moved_milli,
        )


class BurstCollector(Collector):
    """Burst (``JobManager.burst_partition``), from the jobs table: what was sent to the
    burst partition and what it ran there, all time (the jobs' own records: a restart
    loses nothing), and how many jobs are there now."""

    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with self.jobs.db.reading() as s:
            moves, seconds = s.execute(
                select(
                    func.coalesce(func.sum(JobRow.bursts), 0),
                    func.coalesce(func.sum(JobRow.burst_gpu_seconds), 0.0),
                )
            ).one()
            there = [
                r
                for (r,) in s.execute(
                    select(JobRow.backend_ref).where(
                        JobRow.burstable.is_(True), JobRow.state.in_(ACTIVE)
                    )
                )
                if (r or {}).get("burst")
            ]
        yield CounterMetricFamily(
            "gpuslice_burst_moves",
            "Times a waiting burstable job was sent to the burst partition",
            value=int(moves),
        )
        yield CounterMetricFamily(
            "gpuslice_burst_gpu_hours",
            "GPU-hours jobs ran in the burst partition (capacity bought, not this cluster's)",
            value=float(seconds) / 3600,
        )
        yield GaugeMetricFamily(
            "gpuslice_burst_jobs_running",
            "Jobs running in the burst partition now",
            value=len(there),
        )


class SplitPoolCollector(Collector):
    """The split pools (``JobManager.reserved_pools``): each pool's capacity and what is
    held in it by use, and whether batch jobs may borrow the reserved pools now."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        standing = pool_standing(self.ledger, utcnow())
        capacity = GaugeMetricFamily(
            "gpuslice_split_pool_capacity_milli",
            "Milli-GPUs in the pool, drained ones included (reserved pools by name; the rest "
            "is 'peak')",
            labels=["pool"],
        )
        held = GaugeMetricFamily(
            "gpuslice_split_pool_allocated_milli",
            "Milli-GPUs held in the pool, by use: interactive, batch (work the pool serves), "
            "borrowed (preemptible jobs in a reserved pool), external (outside gpuslice)",
            labels=["pool", "use"],
        )
        for pool in standing["pools"]:
            capacity.add_metric([pool["name"]], pool["capacity_milli"])
            for use in USES:
                held.add_metric([pool["name"], use], pool[f"{use}_milli"])
        yield capacity
        yield held
        if standing["borrowing"] is not None:
            yield GaugeMetricFamily(
                "gpuslice_split_pool_borrowing_open",
                "1 while preemptible jobs may borrow the reserved pools",
                value=1 if standing["borrowing"]["open"] else 0,
            )


class OvercommitCollector(Collector):
    """Overcommitted shares held now (``GPUSliceService.share_overcommit_ratio``): how many,
    and how much memory their caps promise beyond what they are charged. What it costs is
    ``gpuslice_idle_events_total{kind="memory-warning"|"memory-culled"}`` and the admin
    panel's *Overcommit* section (per holder)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        _, _, active = self.ledger.snapshot()
        claims = [c for a in active for c in a.claims if c.active and c.charged_milli is not None]
        yield GaugeMetricFamily(
            "gpuslice_overcommit_shares",
            "Shares held now that are charged less than they promise (overcommitted)",
            value=len(claims),
        )
        yield GaugeMetricFamily(
            "gpuslice_overcommit_memory_mib",
            "Memory (MiB) the caps of overcommitted shares promise beyond what they are charged",
            value=sum(c.memory_mib - taken(c)[1] for c in claims),
        )
        yield GaugeMetricFamily(
            "gpuslice_overcommit_milli",
            "Milli-GPU overcommitted shares promise beyond what they are charged",
            value=sum(c.milli - taken(c)[0] for c in claims),
        )


def make_registry(
    ledger: Ledger, capacity: CapacityCheckCache | None = None
) -> tuple[CollectorRegistry, PromCounter]:
    registry = CollectorRegistry()
    registry.register(LedgerCollector(ledger))
    if capacity is not None:
        registry.register(CapacityCheckCollector(capacity))
    registry.register(PoolCollector(ledger))
    registry.register(IdleReclaimCollector(ledger))
    refusals = PromCounter(
        "gpuslice_refusals",
        "Allocation requests refused, by profile and reason code",
        ["profile", "code"],
        registry=registry,
    )
    return registry, refusals


# The scheduler's pass, in a worker thread: what it costs, not what it holds up.
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def pass_histogram(registry: CollectorRegistry) -> Histogram:
    """``gpuslice_scheduler_pass_seconds``, registered when the job scheduler runs."""
    return Histogram(
        "gpuslice_scheduler_pass_seconds",
        "Duration of the job scheduler's passes (run in a worker thread)",
        buckets=PASS_BUCKETS,
        registry=registry,
    )
