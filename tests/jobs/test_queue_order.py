"""The queue order: the scheduler's fast path over its kept queue (submission in
microseconds, two stable sorts) gives exactly the order of the definition (effective
priority, then submission, then id), ties and aging included."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.ordering import effective_priority, micros, queue_order
from gpuslice_hub.jobs.queue_cache import QueuedJob


def by_definition(jobs, now, aging):
    return sorted(jobs, key=lambda j: (-effective_priority(j, now, aging), j.submitted_at, j.id))


@pytest.mark.parametrize("aging", [3600.0, 1800.0, 0.0, 1e-6])
def test_the_kept_queue_is_ordered_as_the_definition_says(aging):
    now = utcnow()
    rng = random.Random(7)
    jobs: list[QueuedJob] = []
    for i in range(3000):
        at = now - timedelta(microseconds=rng.randrange(0, 3 * 3600 * 10**6))
        if i % 5 == 0 and jobs:
            at = jobs[-1].submitted_at  # same instant: the id decides
        if i % 11 == 0:
            at = now - timedelta(seconds=aging)  # exactly one aging period: a tie across classes
        klass = rng.choice(["preemptible", "normal", "high"])
        jobs.append(QueuedJob(i, "u", (), "gpu-1", 1, klass, at, None, None, None, micros(at)))
    rng.shuffle(jobs)
    expected = [j.id for j in by_definition(jobs, now, aging)]
    assert [j.id for j in queue_order(jobs, now, aging)] == expected
    # rows without the microseconds (the jobs API's listing) take the definition's path
    plain = [j.__dict__ | {"submitted_us": None} for j in jobs]

    class Row:
        def __init__(self, d):
            self.__dict__.update(d)

    assert [r.id for r in queue_order([Row(d) for d in plain], now, aging)] == expected
