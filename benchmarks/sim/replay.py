"""A site's own history as a workload: ``gpuslice-sim replay --from-ledger DB_URL``.

From the ledger (read only): the inventory (hosts, GPUs, MIG layout), every interactive
allocation of the window (who, when, which profile, for how long) and every batch job
(when submitted, what it asked for, how long it ran). What the ledger does not keep is
modelled, and the report says so:

- inside a session, use and idleness: the ledger keeps only the latest utilization report
  of each allocation, so stretches are drawn from the interactive generator's parameters
  (``interactive.toml`` or ``--interactive``), seeded; a session the reclaimer culled ends
  with the idle time it recorded;
- a session's peak memory: the most its server reported (schema revision 0007 on), as a
  share of the memory its slice held (its cap); 1 (the whole cap) where nothing was
  reported;
- a job's GPU activity (``--batch-busy`` of its request) and the work of one that did not
  complete in the window (the run time it had, a lower bound: a running job's finished
  attempts plus its current one's time so far). A job still queued at the end of the
  window that never ran is left out (its length is not known), and the report says how
  many were.

Profiles are the site's own, rebuilt by kind and size from what its allocations held (a
MIG instance of the same profile, a share of the same GPU fraction and memory cap, the
same number of whole GPUs), so each session and job asks the simulated cluster for what it
held; a job's size is that of its own (batch) allocations. Only a MIG profile whose
instances the present inventory no longer has becomes a share of its GPU fraction, and the
report's "modelled:" line names every profile that does not keep its name, and why.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session as DBSession

from gpuslice_hub.db.admin_models import UsageReportRow
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import AllocationRow, ClaimRow, EventRow, GPURow, HostRow, MigRow
from gpuslice_hub.jobs.holder import job_holder

from .interactive import draw_stretches
from .policies import PROFILES
from .workload import BatchJob, Session, Stretch, Workload

DAY = 86400.0
# a job still running at the end of the window: the states of a run under way
RUNNING = ("starting", "running", "preempting")
CATALOG = {p["name"]: p for p in PROFILES}


class HistoryError(ValueError):
    """A ledger that cannot be read: the message says why, in one line."""


@contextmanager
def reading(url: str) -> Iterator[DBSession]:
    """A session over the site's database, read only: a SQLite file that does not exist
    is refused (opening it would create an empty one), one that does is opened read-only."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        hint = f" (a SQLite file: sqlite:///{Path(url).resolve()})" if "://" not in url else ""
        raise HistoryError(
            f"{url!r} is not a database URL: give it as DB_URL, e.g. "
            f"sqlite:////abs/path/gpuslice.sqlite or postgresql://user@host/db{hint}"
        ) from None
    if parsed.drivername.startswith("sqlite"):
        name = parsed.database or ""
        if not name or name == ":memory:" or name.startswith("file:"):
            raise HistoryError(f"{url!r}: name the database file, e.g. sqlite:////abs/path")
        path = Path(name)
        if not path.is_file():
            raise HistoryError(f"no such file: {path.resolve()}")
        # read-only: SQLite neither creates nor changes the file. Without a write-ahead log
        # beside it (the service stopped, or never wrote), as immutable: nothing is made
        # beside it either (a read of a WAL database makes its -wal and -shm files).
        query = {"mode": "ro", "uri": "true"}
        if not Path(f"{path}-wal").exists():
            query["immutable"] = "1"
        parsed = parsed.set(database=f"file:{path.resolve()}", query=query)
    try:
        engine = create_engine(parsed)
    except ArgumentError as e:
        raise HistoryError(f"{url!r}: {e}") from None
    try:
        with DBSession(engine) as s:
            yield s  # (closed, never committed: what it read stays loaded)
    except OperationalError as e:
        why = str(e.orig) if e.orig is not None else str(e).splitlines()[0]
        if "no such table" in why:
            why = f"not a gpuslice database ({why})"
        raise HistoryError(f"{url.split('@')[-1]}: {why}") from None
    finally:
        engine.dispose()


def _peak_shares(s: Any) -> dict[int, float]:
    """Per allocation with a reported peak, the peak as a share of the memory it held."""
    held = _held_memory(s)
    out = {}
    for alloc_id, peak in s.execute(
        select(UsageReportRow.allocation_id, UsageReportRow.peak_memory_mib).where(
            UsageReportRow.peak_memory_mib.is_not(None)
        )
    ):
        if held.get(alloc_id):
            out[alloc_id] = round(min(1.0, max(0.01, peak / held[alloc_id])), 4)
    return out


def _held_memory(s: Any) -> dict[int, int]:
    """allocation id -> the GPU memory its claims held (MiB)."""
    held: dict[int, int] = {}
    for alloc_id, memory in s.execute(select(ClaimRow.allocation_id, ClaimRow.memory_mib)):
        held[alloc_id] = held.get(alloc_id, 0) + memory
    return held


def catalog_profile(kind: str, gpu_milli: int, mig_profile: str = "") -> str:
    """The simulator's catalog profile (``policies.PROFILES``) nearest an allocation of
    ``kind`` holding ``gpu_milli``: the smallest that holds it. (A replay uses the site's
    own profiles, ``Profiles``; this is the fallback for a MIG profile the inventory lost.)"""
    if kind == "mig" and mig_profile == "1g.10gb":
        return "mig-1g.10gb"
    if kind == "gpu" and gpu_milli >= 1000:
        n = max(1, round(gpu_milli / 1000))
        return f"gpu-{min((c for c in (1, 2, 4, 8) if c >= n), default=8)}"
    if gpu_milli <= 250:
        return "share-250"
    if gpu_milli <= 500:
        return "share-500"
    return "gpu-1"


@dataclass
class Profiles:
    """The site's profiles as the simulator models them: each allocation's kind and size
    becomes a profile of that kind and size (named by it), added to the simulated profile
    set where the catalog lacks it."""

    mig_present: set[str]  # the MIG instance profiles the present inventory has
    defined: dict[str, dict[str, Any]] = field(default_factory=dict)  # beyond the catalog
    # site profile -> (simulated profile, why it is not the same kind and size, or "")
    mapped: dict[str, tuple[str, str]] = field(default_factory=dict)

    def of(self, site: str, kind: str, milli: int, mig: str, memory: int) -> str:
        """The simulated profile of an allocation of the site's profile ``site``."""
        name, why = self._model(kind, milli, mig, memory)
        self.mapped.setdefault(site, (name, why))
        return name

    def _model(self, kind: str, milli: int, mig: str, memory: int) -> tuple[str, str]:
        """(simulated profile, why it is not of the same kind and size, or "")."""
        why = ""
        if kind == "mig":
            if mig in self.mig_present:
                name = "mig-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in mig)
                return self._define({"name": name, "kind": "mig", "mig_profile": mig}), ""
            why = (
                f"no {mig or 'such'} MIG instance in the present inventory: "
                f"{'a whole GPU' if milli >= 1000 else 'a share of its GPU fraction'}"
            )
            kind = "share"
        if kind == "gpu" or milli >= 1000:
            count = min(16, max(1, round(milli / 1000)))
            return self._define({"name": f"gpu-{count}", "kind": "gpu", "count": count}), why
        milli = min(999, max(1, milli))
        profile: dict[str, Any] = {"name": f"share-{milli}", "kind": "share", "gpu_milli": milli}
        profile["gpu_memory_mib"] = memory
        same = CATALOG.get(profile["name"])
        if same is not None and same != profile:
            # the catalog's share of that size has another memory cap: a name of its own
            profile["name"] = f"share-{milli}-{memory}mib"
        return self._define(profile), why

    def _define(self, profile: dict[str, Any]) -> str:
        if profile["name"] not in CATALOG:
            self.defined.setdefault(profile["name"], profile)
        return str(profile["name"])

    def said(self) -> str:
        """What the report says of them: every site profile that does not keep its name
        (the same kind and size, or why not)."""
        renamed = [
            f"{site} as {name}" + (f" ({why})" if why else "")
            for site, (name, why) in sorted(self.mapped.items())
            if site != name
        ]
        if not self.mapped:
            return "profiles: none held in the window"
        kept = len(self.mapped) - len(renamed)
        out = f"profiles: the site's own, by kind and size ({kept} kept their names"
        if renamed:
            out += "; " + ", ".join(renamed)
        return out + ")"


@dataclass
class LeftOut:
    """Jobs of the window a replay cannot include, counted for the report."""

    queued: int = 0  # still queued at the end, never ran: their length is not known
    nothing_kept: int = 0  # ended having kept no work (cancelled or failed before running)
    size_unknown: int = 0  # included as one whole GPU: no allocation says their size

    def said(self) -> list[str]:
        out = []
        if self.queued:
            out.append(
                f"{self.queued} jobs still queued at the end of the window were left out: "
                "their length is not known"
            )
        if self.nothing_kept:
            out.append(
                f"{self.nothing_kept} jobs that ended without keeping any work (cancelled or "
                "failed) were left out"
            )
        if self.size_unknown:
            out.append(
                f"{self.size_unknown} jobs whose size no allocation records were taken as "
                "one whole GPU"
            )
        return out


def export(
    url: str,
    days: float,
    params: dict[str, Any],
    seed: int,
    batch_busy: float,
    end: datetime | None = None,
) -> Workload:
    """The last ``days`` up to ``end`` (default: the newest record) as a workload."""
    with reading(url) as s:
        hosts = _inventory(s)
        allocs = list(
            s.execute(
                select(
                    AllocationRow.id,
                    AllocationRow.user,
                    AllocationRow.groups,
                    AllocationRow.kind,
                    AllocationRow.purpose,
                    AllocationRow.server_name,
                    AllocationRow.gpu_milli,
                    AllocationRow.profile,
                    AllocationRow.created_at,
                    AllocationRow.released_at,
                )
            )
        )
        culled = {
            e.allocation_id: float((e.detail or {}).get("idle_seconds") or 0.0)
            for e in s.execute(
                select(EventRow.allocation_id, EventRow.detail).where(
                    EventRow.kind == "idle-culled"
                )
            )
        }
        mig_of = _mig_profiles(s)
        memory_of = _held_memory(s)
        peaks = _peak_shares(s)
        jobs = list(s.scalars(select(JobRow)))
    interactive = [a for a in allocs if a.purpose == "interactive"]
    if end is None:
        # the newest record: an allocation made or released, a job submitted, started or
        # finished
        newest = [a.created_at for a in allocs] + [a.released_at for a in allocs]
        newest += [j.submitted_at for j in jobs] + [j.finished_at for j in jobs]
        newest += [j.attempt_started_at for j in jobs]
        end = max((t for t in newest if t is not None), default=datetime.now().astimezone())
    start = end - timedelta(days=days)
    present = {p for h in hosts for g in h["gpus"] for p in g.get("mig", [])}
    profiles = Profiles(present)

    def modelled(a: Any) -> str:
        memory = memory_of.get(a.id, 0)
        return profiles.of(a.profile, a.kind, a.gpu_milli, mig_of.get(a.id, ""), memory)

    rng = random.Random(seed)
    sessions: list[Session] = []
    for a in sorted(interactive, key=lambda a: (a.created_at, a.id)):
        if not start <= a.created_at <= end:
            continue
        stop = min(a.released_at or end, end)
        length = max(60.0, (stop - a.created_at).total_seconds())
        idle_tail = min(culled.get(a.id, 0.0), length)
        stretches = _fit(rng, params, length - idle_tail, a.gpu_milli)
        if idle_tail:
            stretches.append(Stretch(idle_tail))
        profile = modelled(a)
        group = (a.groups or ["(no group)"])[0]
        arrival = (a.created_at - start).total_seconds()
        # a server of several whole GPUs: the stretches are per GPU (drawn for one GPU)
        gpus = max(1, a.gpu_milli // 1000) if a.kind == "gpu" else 1
        sessions.append(
            Session(
                len(sessions),
                a.user,
                group,
                arrival,
                profile,
                tuple(stretches),
                gpus,
                peaks.get(a.id, 1.0),
            )
        )
    # each job's own allocations (its runs'), the latest first; and any allocation of a
    # profile, for a job none of whose runs is recorded
    own: dict[str, Any] = {}
    by_profile: dict[str, Any] = {}
    for a in sorted(allocs, key=lambda a: a.id):
        if a.purpose == "batch":
            own[a.server_name] = a
        by_profile.setdefault(a.profile, a)
    batch: list[BatchJob] = []
    left = LeftOut()
    for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        if not start <= j.submitted_at <= end:
            continue
        work = j.run_seconds - j.lost_work_seconds
        if j.state in RUNNING and j.attempt_started_at is not None:
            # its finished attempts, and the current one's time so far
            work += max(0.0, (end - j.attempt_started_at).total_seconds())
        if work <= 0:
            if j.state in ("queued", *RUNNING):
                left.queued += 1
            else:
                left.nothing_kept += 1
            continue
        alloc = own.get(job_holder(j.id)) or by_profile.get(j.profile)
        if alloc is not None:
            profile, milli = modelled(alloc), int(alloc.gpu_milli)
            kind = alloc.kind
        else:
            left.size_unknown += 1
            profile, milli, kind = profiles.of(j.profile, "gpu", 1000, "", 0), 1000, "gpu"
        batch.append(
            BatchJob(
                id=len(batch),
                user=j.user,
                group=(j.groups or ["(no group)"])[0],
                arrival=(j.submitted_at - start).total_seconds(),
                profile=profile,
                work=work,
                busy_milli=max(1, round(min(milli, 1000) * batch_busy)),
                slices=j.slices,
                checkpoint_interval=j.checkpoint_interval,
                # a slice of several whole GPUs keeps each of them busy
                gpus=max(1, milli // 1000) if kind == "gpu" else 1,
            )
        )
    sources = [
        f"history: {url.split('@')[-1]} from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC "
        f"({len(sessions)} sessions, {len(batch)} jobs, {len(hosts)} hosts)",
        f"modelled: use and idleness inside sessions (generator, seed {seed}); jobs keep "
        f"{batch_busy:.0%} of their request busy; " + profiles.said(),
        *left.said(),
    ]
    return Workload(days, sessions, batch, sources, hosts, list(profiles.defined.values()))


def _fit(rng: random.Random, params: dict[str, Any], length: float, milli: int) -> list[Stretch]:
    """Stretches drawn from the generator's parameters, cut to exactly ``length`` s."""
    if length <= 0:
        return []
    ses = {**params["session"], "left_running_share": 0.0, "length_sigma": 0.0}
    ses["length_median_hours"] = ses["length_max_hours"] = length / 3600
    drawn = draw_stretches(rng, ses, params["stretches"], min(milli, 1000))
    out, used = [], 0.0
    for st in drawn:
        seconds = min(st.seconds, length - used)
        if seconds <= 0:
            break
        out.append(Stretch(seconds, st.busy_milli, st.visible))
        used += seconds
    return out


def _mig_profiles(s: Any) -> dict[int, str]:
    """allocation id -> the MIG profile it held (from its claims)."""
    rows = s.execute(
        select(ClaimRow.allocation_id, MigRow.profile).join(
            MigRow, MigRow.uuid == ClaimRow.mig_uuid
        )
    )
    return {alloc_id: profile for alloc_id, profile in rows}


def _inventory(s: Any) -> list[dict[str, Any]]:
    """The ledger's present hosts in the simulated discovery's format."""
    hosts = {h.name: h for h in s.scalars(select(HostRow).where(HostRow.present))}
    gpus = list(s.scalars(select(GPURow).where(GPURow.present).order_by(GPURow.host, GPURow.index)))
    migs: dict[str, list[str]] = {}
    for m in s.scalars(select(MigRow).where(MigRow.present)):
        migs.setdefault(m.gpu_uuid, []).append(m.profile)
    out: dict[str, dict[str, Any]] = {}
    for g in gpus:
        h = hosts.get(g.host)
        if h is None:
            continue
        host = out.setdefault(
            h.name,
            {"name": h.name, "cpu_milli": h.cpu_milli, "memory_mib": h.memory_mib, "gpus": []},
        )
        gpu: dict[str, Any] = {"model": g.model, "memory_mib": g.memory_mib}
        if migs.get(g.uuid):
            gpu["mig"] = sorted(migs[g.uuid])
        host["gpus"].append(gpu)
    return list(out.values())
