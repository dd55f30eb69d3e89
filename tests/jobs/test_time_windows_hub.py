"""A batch time window's edges with a real JupyterHub, the gpuslice service and the local
job runner: the job waits for its window, runs in it, is checkpointed and requeued when it
closes, and resumes from its checkpoint when it opens again.

The window is two spans a few seconds from now (spans may be given to the second)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from tests.harness.hub import wait_for
from tests.jobs.notebooks import TRAIN_CELLS, loop_checkpoint_written
from tests.jobs.test_jobs_hub import (
    ONE_GPU,
    PROFILES,
    RESULT_CELL,
    expected_w,
    job,
    job_dir,
    output_result,
    submit,
    wait_state,
)

pytestmark = pytest.mark.hub


def span(start: datetime, seconds: float) -> str:
    return f"{start:%H:%M:%S}-{start + timedelta(seconds=seconds):%H:%M:%S}"


def test_a_job_runs_only_inside_its_window_and_resumes_at_the_next_opening(hub_factory):
    now = datetime.now(UTC).replace(microsecond=0)
    first = now + timedelta(seconds=10)
    # 60 s to start and checkpoint (a loaded CI machine starts kernels slowly), then 20 s
    # closed
    second = first + timedelta(seconds=80)
    spans = [span(first, 60), span(second, 600)]
    hub = hub_factory(
        hosts=ONE_GPU,
        profiles=PROFILES,
        extra_service_config=(
            f"c.JobManager.time_windows = {{'soon': {spans!r}}}\n"
            "c.JobManager.time_window_timezone = 'UTC'\n"
        ),
    )
    alice = hub.add_user("alice")
    windows = hub.api("GET", "/api/profiles", alice).json()["jobs"]["windows"]
    assert [w["name"] for w in windows] == ["soon"] and windows[0]["text"].endswith("(UTC)")

    r = submit(hub, alice, time_window="later")
    assert r.status_code == 400 and "unknown time window 'later'" in r.json()["message"]
    steps, lr = 6000, 0.05
    r = submit(
        hub,
        alice,
        cells=[*TRAIN_CELLS[:3], RESULT_CELL],
        parameters={"steps": steps, "lr": lr, "delay": 0.01},
        checkpoint_interval=1,
        time_window="soon",
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert r.json()["time_window"] == "soon"

    metrics = hub.api("GET", "/metrics", hub.config["metrics_token"]).text
    assert 'gpuslice_time_window_open{window="soon"}' in metrics

    # the window opens: it runs and checkpoints
    wait_state(hub, alice, job_id, "running", timeout=60)
    assert datetime.now(UTC) >= first
    wait_for(lambda: loop_checkpoint_written(job_dir(hub, job_id)), 40, "a first checkpoint")

    # the window closes: checkpointed, requeued, waiting for the next opening
    j = wait_state(hub, alice, job_id, "queued", timeout=120)
    assert datetime.now(UTC) >= first + timedelta(seconds=60)
    states = [t["state"] for t in j["transitions"]]
    assert states[-3:] == ["preempting", "preempted", "queued"], states
    assert j["transitions"][-3]["reason"] == "its time window 'soon' closed (by scheduler)"
    assert j["preemptions"] == 1
    # the GPU is free, but the window is closed: it says what it waits for, and waits
    wait_for(
        lambda: (
            "waits for its time window 'soon'" in (job(hub, alice, job_id)["waiting_reason"] or "")
        ),
        30,
        "the job to say it waits for its window",
    )

    # it opens again: the job resumes from its checkpoint and finishes
    done = wait_state(hub, alice, job_id, ("completed", "failed"), timeout=300)
    assert done["state"] == "completed", done
    restart = next(t for t in reversed(done["transitions"]) if t["state"] == "starting")
    assert datetime.fromisoformat(restart["at"].replace("Z", "+00:00")) >= second
    result = output_result(hub, alice, job_id)
    assert 0 < result["first_step"] < steps
    np.testing.assert_array_equal(result["w"], expected_w(steps, lr))
