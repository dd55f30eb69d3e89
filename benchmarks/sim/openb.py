"""Batch jobs from the openb traces (``../shared/data/openb``, Alibaba's
cluster-trace-gpu-v2023).

Each GPU task of the trace becomes a notebook job: its request gives the size (``num_gpu``
whole GPUs, or a ``gpu_milli`` share of one), ``deletion_time - creation_time`` the GPU
time it needs, and ``creation_time`` when it arrives. The trace covers 149 days of a
6 212-GPU cluster whose tasks (up to a week long) hold about 7 GPUs on average, so
arrivals are compressed to offer ``load`` times the simulated cluster's GPUs, and the
trace is read again from the start (shifted by a seed-chosen offset) as often as the
horizon needs.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from .workload import BatchJob

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"
# Shorter tasks are left out by default: a notebook worth submitting as a batch job runs
# for at least half an hour (in the default trace, tasks under 30 minutes are 74 % of the
# GPU tasks but 7 % of their GPU time; each would cost the simulation as much as a long one).
MIN_WORK = 1800.0
# Longer tasks are left out: the 32 that live through the trace's whole span are services,
# not notebooks, and no job may ask for more (JobManager.max_runtime_limit's default).
MAX_WORK = 7 * 86400.0


@dataclass(frozen=True)
class Task:
    created: float
    work: float
    gpus: int
    milli: int  # of one GPU when gpus == 1, else 1000


def trace_path(trace: str, data: Path = DATA) -> Path:
    """The file of a trace: its name's in ``data``, or a CSV file in the same format."""
    return Path(trace) if trace.endswith(".csv") else data / f"openb_pod_list_{trace}.csv"


def read_tasks(trace: str = "default", data: Path = DATA, min_work: float = MIN_WORK) -> list[Task]:
    """The trace's GPU tasks; FileNotFoundError or ValueError (naming the file and what is
    wrong with it) when it cannot be read."""
    path = trace_path(trace, data)
    if not path.is_file():
        known = sorted(
            p.stem.removeprefix("openb_pod_list_") for p in data.glob("openb_pod_list_*.csv")
        )
        raise FileNotFoundError(
            f"no openb trace {trace!r} ({path} is missing); known: {', '.join(known) or 'none'}"
            ", or a .csv file in its format"
        )
    tasks = []
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                gpus = int(row["num_gpu"])
                if gpus == 0:
                    continue
                created, deleted = float(row["creation_time"]), float(row["deletion_time"])
                milli = int(row["gpu_milli"]) if gpus == 1 else 1000
            except KeyError as e:
                raise ValueError(f"{path}: no column {e} (openb's format)") from None
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {line}: not a number where one belongs") from None
            work = deleted - created
            if min_work <= work <= MAX_WORK:
                tasks.append(Task(created, work, gpus, milli or 1000))
    tasks.sort(key=lambda t: t.created)
    if len(tasks) < 2 or tasks[-1].created == tasks[0].created:
        raise ValueError(
            f"{path}: fewer than two GPU tasks of {min_work / 60:g} minutes to "
            f"{MAX_WORK / 86400:g} days arriving at different times"
        )
    return tasks


def profile_for(task: Task, whole_only: bool) -> tuple[str, int]:
    """(profile, slices) a task asks for. With slices, the smallest share that holds its
    ``gpu_milli``; whole GPUs otherwise (what a site without sharing hands out)."""
    if task.gpus > 1:
        return f"gpu-{task.gpus}", 1
    if not whole_only:
        if task.milli <= 250:
            return "share-250", 1
        if task.milli <= 500:
            return "share-500", 1
    return "gpu-1", 1


def batch_jobs(
    days: float,
    capacity_gpus: int,
    load: float,
    seed: int,
    busy: float,
    checkpoint_interval: float,
    users: int,
    groups: int,
    trace: str = "default",
    min_work: float = MIN_WORK,
    first_id: int = 0,
) -> list[BatchJob]:
    """Jobs arriving over ``days``, offering ``load`` x ``capacity_gpus`` GPUs of work on
    average (0: none). ``busy``: the share of its GPU request a running job keeps busy.
    Profiles are the slice profiles; a policy with whole GPUs only maps them (``whole``)."""
    if load <= 0:
        return []
    tasks = read_tasks(trace, min_work=min_work)
    span = tasks[-1].created - tasks[0].created
    offered = sum(t.work * t.gpus * t.milli / 1000 for t in tasks) / span  # GPUs, on average
    squeeze = load * capacity_gpus / offered
    rng = random.Random(seed)
    offset = rng.random() * span
    horizon = days * 86400.0
    jobs: list[BatchJob] = []
    cycle = 0
    while True:
        for t in tasks:
            at = ((t.created - tasks[0].created + span - offset) % span + cycle * span) / squeeze
            if at >= horizon:
                continue
            profile, slices = profile_for(t, whole_only=False)
            user = rng.randrange(users)
            jobs.append(
                BatchJob(
                    id=0,
                    user=f"user{user:04d}",
                    group=f"group{user % groups:02d}",
                    arrival=at,
                    profile=profile,
                    work=t.work,
                    busy_milli=max(1, round(t.milli * busy)),
                    slices=slices,
                    checkpoint_interval=checkpoint_interval,
                    # a multi-GPU task keeps each of its GPUs busy (its milli is per GPU)
                    gpus=max(1, t.gpus),
                    request_milli=t.milli if t.gpus == 1 and t.milli < 1000 else 0,
                )
            )
        cycle += 1
        if cycle * span / squeeze >= horizon:
            break
    jobs.sort(key=lambda j: j.arrival)
    return [
        BatchJob(first_id + i, *(getattr(j, f) for f in BatchJob.__dataclass_fields__ if f != "id"))
        for i, j in enumerate(jobs)
    ]
