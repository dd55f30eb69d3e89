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
  complete in the window (the run time it had, a lower bound);
- profiles are mapped onto the simulator's catalog (``policies.PROFILES``) by kind and
  size: a MIG profile other than 1g.10gb, or a share, becomes the smallest share that
  holds its GPU fraction.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from gpuslice_hub.db.admin_models import UsageReportRow
from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import AllocationRow, ClaimRow, EventRow, GPURow, HostRow, MigRow

from .interactive import draw_stretches
from .workload import BatchJob, Session, Stretch, Workload

DAY = 86400.0


def _peak_shares(s: Any) -> dict[int, float]:
    """Per allocation with a reported peak, the peak as a share of the memory it held."""
    held: dict[int, int] = {}
    for alloc_id, memory in s.execute(select(ClaimRow.allocation_id, ClaimRow.memory_mib)):
        held[alloc_id] = held.get(alloc_id, 0) + memory
    out = {}
    for alloc_id, peak in s.execute(
        select(UsageReportRow.allocation_id, UsageReportRow.peak_memory_mib).where(
            UsageReportRow.peak_memory_mib.is_not(None)
        )
    ):
        if held.get(alloc_id):
            out[alloc_id] = round(min(1.0, max(0.01, peak / held[alloc_id])), 4)
    return out


def catalog_profile(kind: str, gpu_milli: int, mig_profile: str = "") -> str:
    """The simulator's profile for an allocation of ``kind`` holding ``gpu_milli``."""
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


def export(
    url: str,
    days: float,
    params: dict[str, Any],
    seed: int,
    batch_busy: float,
    end: datetime | None = None,
) -> Workload:
    """The last ``days`` up to ``end`` (default: the newest record) as a workload."""
    db = open_database(url)
    try:
        with db.reading() as s:
            hosts = _inventory(s)
            allocs = list(
                s.execute(
                    select(
                        AllocationRow.id,
                        AllocationRow.user,
                        AllocationRow.groups,
                        AllocationRow.kind,
                        AllocationRow.gpu_milli,
                        AllocationRow.profile,
                        AllocationRow.created_at,
                        AllocationRow.released_at,
                    ).where(AllocationRow.purpose == "interactive")
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
            peaks = _peak_shares(s)
            jobs = list(s.scalars(select(JobRow)))
    finally:
        db.dispose()
    if end is None:
        # the newest record: an allocation made or released, a job submitted or finished
        newest = [a.created_at for a in allocs] + [a.released_at for a in allocs]
        newest += [j.submitted_at for j in jobs] + [j.finished_at for j in jobs]
        end = max((t for t in newest if t is not None), default=datetime.now().astimezone())
    start = end - timedelta(days=days)
    rng = random.Random(seed)
    sessions: list[Session] = []
    for a in sorted(allocs, key=lambda a: (a.created_at, a.id)):
        if not start <= a.created_at <= end:
            continue
        stop = min(a.released_at or end, end)
        length = max(60.0, (stop - a.created_at).total_seconds())
        idle_tail = min(culled.get(a.id, 0.0), length)
        stretches = _fit(rng, params, length - idle_tail, a.gpu_milli)
        if idle_tail:
            stretches.append(Stretch(idle_tail))
        profile = catalog_profile(a.kind, a.gpu_milli, mig_of.get(a.id, ""))
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
    batch: list[BatchJob] = []
    for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        if not start <= j.submitted_at <= end:
            continue
        work = j.run_seconds - j.lost_work_seconds
        if work <= 0:
            continue  # never ran, or ran nothing it kept: no work to replay
        milli = _job_milli(j.profile, allocs)
        profile = catalog_profile("gpu" if milli >= 1000 else "share", milli)
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
                gpus=max(1, milli // 1000),
            )
        )
    sources = [
        f"history: {url.split('@')[-1]} from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC "
        f"({len(sessions)} sessions, {len(batch)} jobs, {len(hosts)} hosts)",
        f"modelled: use and idleness inside sessions (generator, seed {seed}); jobs keep "
        f"{batch_busy:.0%} of their request busy",
    ]
    return Workload(days, sessions, batch, sources, hosts)


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


def _job_milli(profile: str, allocs: list[Any]) -> int:
    """A job profile's GPU share, as its allocations recorded it (1000 when unknown)."""
    for a in allocs:
        if a.profile == profile:
            return int(a.gpu_milli)
    return 1000


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
