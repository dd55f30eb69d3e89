"""A batch job's slice names its job (jobs/holder.py): the one way back from a slice to
the job once the job no longer lists it."""

from __future__ import annotations

import pytest

from gpuslice_hub.jobs.holder import holder_job, job_holder


@pytest.mark.parametrize("job_id", [1, 42, 2**62])
def test_a_jobs_holder_name_leads_back_to_the_job(job_id: int) -> None:
    assert holder_job(job_holder(job_id)) == job_id


@pytest.mark.parametrize(
    "name", ["", "lab", "job-", "job-x1", "jobs-1", "job-1a", "job-١٢", "x-job-1"]
)
def test_a_name_no_job_holds_by_is_no_job(name: str) -> None:
    assert holder_job(name) is None
