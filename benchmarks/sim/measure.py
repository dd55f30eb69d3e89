"""What a simulation reports, read the way the admin panel reads it where the panel has
the figure (allocated GPU-hours, reclaimed GPU-hours, fragmentation, the job records),
and from the simulation's own truth where only it knows (work done, work lost).

- allocation rate: the allocated milli-GPU-seconds of every allocation inside the horizon
  (the admin panel's GPU-hours: each allocation's life times its GPU share) over capacity;
- effective utilization: useful GPU work (busy milli-GPU-seconds of session stretches that
  were played, batch work that was kept; work a cull or a preemption threw away is not
  useful) over capacity x time. With overcommit, holders of one GPU can together ask more
  than its 1000 milli-GPU at once; what they ask beyond it (sampled every ``sample_every``)
  is taken off, since time slicing divides the GPU rather than adding to it.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from gpuslice_hub.admin.accounting import reclaimed
from gpuslice_hub.admin.capacity_check import capacity_check
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import AllocationRow

if TYPE_CHECKING:
    from .engine import Result, Simulation


def demand(sim: Simulation) -> float:
    """The busy GPU work the workload offers inside the horizon, in milli-GPU-seconds: each
    session's stretches played from its arrival, each batch job's work from its arrival,
    with no wait, no cull and no loss. No scheduler gets more done than this on the same
    workload (it is the bound a utilization figure is reported beside: issue 47)."""
    end = sim.horizon
    total = 0.0
    for session in sim.workload.sessions:
        at = session.arrival
        for stretch in session.stretches:
            if at >= end:
                break
            total += stretch.busy_milli * session.gpus * max(0.0, min(stretch.seconds, end - at))
            at += stretch.seconds
    for job in sim.workload.jobs:
        if job.arrival < end:
            total += job.busy_total * min(job.work, end - job.arrival)
    return total


def finish(sim: Simulation) -> None:
    r, end = sim.result, sim.horizon
    r.demand_milli_seconds = demand(sim)
    epoch = sim.clock.now().timestamp() - end
    # requests still waiting at the end: counted, neither granted nor given up
    r.requests.extend(sim.asking.values())
    # sessions still holding a slice at the end: the work played so far (a stretch still
    # going has lost nothing: what ``_played`` calls cut short counts)
    for live in list(sim.live.values()):
        useful, going, _, _ = sim._played(live, end)
        r.interactive_useful += useful + going
    # batch: what the runs kept, and what the running ones have done so far
    sim.backend.settle(end)
    for job_id, kept in sim.backend.kept.items():
        job = sim.jobs_by_id[job_id]
        r.batch_useful += kept * job.busy_total
    r.losses = list(sim.backend.losses)
    for job_id, lost in sim.backend.lost.items():
        job = sim.jobs_by_id[job_id]
        r.batch_lost += lost * job.busy_total
    for job_id, done in sim.backend.progress(end).items():
        job = sim.jobs_by_id[job_id]
        r.batch_useful += done * job.busy_total
    with sim.ledger.db.reading() as s:
        allocs = s.execute(
            select(AllocationRow.gpu_milli, AllocationRow.created_at, AllocationRow.released_at)
        ).all()
        jobs = list(s.scalars(select(JobRow)))
        starts = dict(
            s.execute(
                select(JobTransitionRow.job_id, JobTransitionRow.at)
                .where(JobTransitionRow.state == "starting")
                .order_by(JobTransitionRow.id)  # the dict keeps the latest start
            ).all()
        )
    for milli, created, released in allocs:
        a = created.timestamp() - epoch
        b = end if released is None else released.timestamp() - epoch
        r.allocated_milli_seconds += milli * max(0.0, min(b, end) - a)
    r.reclaimed_gpu_hours = reclaimed(sim.ledger, sim.clock.now())["total"]
    r.capacity_check = capacity_check(sim.ledger, sim.clock.now())

    def since(at: datetime | None) -> float | None:
        return None if at is None else at.timestamp() - epoch

    for row in jobs:
        spec = sim.jobs_by_id.get(row.id)
        burst = r.bursts.get(row.id)
        if burst is not None:
            # sent to the burst partition: it started there at once, and ended there
            sent, done, _ = burst
            r.batch_jobs.append(
                {
                    "arrival": since(row.submitted_at),
                    "first_start": since(row.started_at) if row.started_at else sent,
                    "last_start": sent,
                    "ended": done if done <= end else None,
                    "state": "completed" if done <= end else "running",
                    "preemptions": row.preemptions,
                    "lost": row.lost_work_seconds,
                    "work": spec.work if spec else 0.0,
                    "milli": spec.busy_total if spec else 0,
                    "gpus": spec.gpus * spec.slices if spec else 0,
                    "burst": True,
                }
            )
            continue
        # time on a GPU: the runs that ended, and the one going on at the end
        ran = float(row.run_seconds or 0.0)
        if row.attempt_started_at is not None and row.state in (
            "starting",
            "running",
            "preempting",
        ):
            ran += max(0.0, end - (since(row.attempt_started_at) or end))
        r.batch_jobs.append(
            {
                "arrival": since(row.submitted_at),
                "ran": ran,
                "first_start": since(row.started_at),
                "last_start": since(starts.get(row.id)),
                "ended": since(row.finished_at),
                "state": row.state,
                "preemptions": row.preemptions,
                "lost": row.lost_work_seconds,
                "work": spec.work if spec else 0.0,
                "milli": spec.busy_total if spec else 0,
                "gpus": spec.gpus * spec.slices if spec else 0,
            }
        )


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def summary(r: Result) -> dict[str, Any]:
    """The figures of one run, as the report's table shows them."""
    cap = r.capacity_milli * r.horizon
    got = [q for q in r.requests if q.granted is not None]
    # a researcher who gave up counts with the wait they gave up after (issue 47: left out,
    # they made the figures look better the more people gave up)
    waits = [q.granted - q.asked for q in got if q.granted is not None] + [
        q.gave_up_at - q.asked for q in r.requests if q.gave_up and q.gave_up_at is not None
    ]
    refused_first = sum(1 for q in r.requests if q.refusals)
    done = [j for j in r.batch_jobs if j["state"] == "completed" and j["ended"] is not None]
    started = [j for j in r.batch_jobs if j["first_start"] is not None]
    # every wait of a job in the queue (after each requeue too), up to the horizon for a job
    # still waiting there: its time from submission to its end (or the horizon) that it was
    # not on a GPU (issue 47: only the first wait was counted, and jobs never started not
    # at all); a job sent to a burst partition waited until it was sent
    queue = [
        max(0.0, (j["ended"] if j["ended"] is not None else r.horizon) - j["arrival"] - j["ran"])
        for j in r.batch_jobs
        if j["arrival"] is not None and "ran" in j
    ] + [j["first_start"] - j["arrival"] for j in started if j.get("burst")]
    preempted = sum(j["preemptions"] for j in r.batch_jobs)
    frag = [s["fragmented"] for s in r.samples]
    effective = (r.interactive_useful + r.batch_useful - r.contention_milli_seconds) / cap
    bound = r.demand_milli_seconds / cap
    # jobs that had two days or more and never started, by the GPUs they asked for: a
    # size the queue never serves (a median wait hides it)
    late = r.horizon - 2 * 86400.0
    never: dict[str, int] = {}
    for j in r.batch_jobs:
        if j["first_start"] is None and j["arrival"] is not None and j["arrival"] < late:
            key = str(j.get("gpus") or 0)
            never[key] = never.get(key, 0) + 1
    return {
        "policy": r.policy.name,
        "title": r.policy.title,
        "allocation_rate": r.allocated_milli_seconds / cap,
        # work asked of a GPU beyond its capacity at once (overcommit) was not done
        "effective_utilization": effective,
        # the most any scheduler could do on this workload, and how much of it this got
        "demand_bound": bound,
        "share_of_bound": effective / bound if bound else None,
        "jobs_not_started_by_gpus": dict(sorted(never.items(), key=lambda kv: int(kv[0]))),
        "interactive_utilization": r.interactive_useful / cap,
        "batch_utilization": r.batch_useful / cap,
        "requests": len(r.requests),
        "wait_p50": _pct(waits, 50),
        "wait_p95": _pct(waits, 95),
        "refused_share": refused_first / len(r.requests) if r.requests else 0.0,
        "gave_up": sum(1 for q in r.requests if q.gave_up),
        "waiting_at_end": sum(1 for q in r.requests if q.granted is None and not q.gave_up),
        "culls": r.culls,
        "warnings": r.warnings,
        "keep_alives": r.keep_alives,
        "interactive_lost_gpu_hours": r.interactive_lost / 1000 / 3600,
        "reclaimed_gpu_hours": r.reclaimed_gpu_hours,
        "jobs_submitted": len(r.batch_jobs),
        "jobs_completed": len(done),
        "queue_p50_h": _h(_pct(queue, 50)),
        "queue_p95_h": _h(_pct(queue, 95)),
        "completion_p50_h": _h(_pct([j["ended"] - j["arrival"] for j in done], 50)),
        "preemptions_per_job": preempted / len(started) if started else 0.0,
        "lost_per_stop_mean_s": statistics.fmean(r.losses) if r.losses else 0.0,
        "lost_per_stop_max_s": max(r.losses, default=0.0),
        "batch_lost_gpu_hours": r.batch_lost / 1000 / 3600,
        "fragmented_share": (statistics.fmean(frag) / r.capacity_milli) if frag else 0.0,
        "jobs_moved": r.moved_jobs,
        "overcommitted_grants": r.overcommitted_grants,
        "share_grants": r.share_grants,
        "memory_collisions": r.memory_collisions,
        "contention_gpu_hours": r.contention_milli_seconds / 1000 / 3600,
        # burst: jobs sent to capacity bought elsewhere, and its GPU-hours (the work of
        # those jobs is not this cluster's: not in effective utilization)
        "jobs_burst": len(r.bursts),
        "burst_gpu_hours": sum(b[2] for b in r.bursts.values()) / 3600,
        "quotas_applied": r.quotas_applied,
        "quota_refusals": r.quota_refusals,
        "wall_seconds": r.wall_seconds,
        # what the admin panel's capacity check says of this run (its verdicts' codes)
        "capacity_check": " ".join(v["code"] for v in (r.capacity_check or {}).get("verdicts", [])),
    }


def _h(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600
