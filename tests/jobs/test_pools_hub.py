"""Split pools with a real JupyterHub, the gpuslice service and the local job runner: a
preemptible job borrows the reserved pool's idle GPU while the borrowing window is open, is
checkpointed and requeued when it closes, waits beside the reserved GPU, and runs in the
peak pool once that has room.

The borrowing window is a span a few seconds from now (spans may be given to the second)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.harness.hub import wait_for
from tests.jobs.notebooks import loop_checkpoint_written
from tests.jobs.test_jobs_hub import PROFILES, job, job_dir, submit, wait_state
from tests.jobs.test_time_windows_hub import span

pytestmark = pytest.mark.hub

A100 = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1}
TWO_NODES = [
    {"name": name, "cpu_milli": 32000, "memory_mib": 256000, "gpus": [A100]}
    for name in ("peak-node", "people-node")
]
# checkpoints every step; far longer than the test
ENDLESS = [
    "import time\nimport gpuslice.checkpoint\nckpt = gpuslice.checkpoint.open()\nckpt.restore()",
    "for step in ckpt.steps(10**6):\n    time.sleep(0.01)\n    ckpt.save(step=step)",
]


def placed_on(j: dict) -> list[str]:
    return [t["reason"] for t in j["transitions"] if t["state"] == "starting"]


def pool(hub, admin, name: str) -> dict:
    pools = hub.api("GET", "/api/admin/pools", admin).json()["pools"]
    return next(p for p in pools if p["name"] == name)


def test_a_preemptible_job_borrows_the_reserved_pool_and_returns_it_at_the_close(hub_factory):
    opens = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=10)
    # 90 s for the hub to start and the job to start and checkpoint on a loaded machine
    hub = hub_factory(
        hosts=TWO_NODES,
        profiles=PROFILES,
        extra_service_config=(
            f"c.JobManager.time_windows = {{'soon': {[span(opens, 90)]!r}}}\n"
            "c.JobManager.time_window_timezone = 'UTC'\n"
            "c.JobManager.reserved_pools = {'people': {'hosts': ['people-node']}}\n"
            "c.JobManager.reserved_pool_borrowing = 'soon'\n"
        ),
    )
    alice = hub.add_user("alice")
    admin = hub.add_user("admin", admin=True)

    # a normal job takes the peak pool; it never borrows
    normal = submit(hub, alice, cells=ENDLESS, checkpoint_interval=1, priority="normal").json()
    wait_state(hub, alice, normal["id"], "running", timeout=90)
    assert "peak-node" in placed_on(job(hub, alice, normal["id"]))[0]
    r = submit(hub, alice, cells=ENDLESS, checkpoint_interval=1, priority="preemptible")
    assert r.status_code == 201, r.text
    borrower = r.json()["id"]

    # the window opens: the preemptible job borrows the reserved GPU
    wait_state(hub, alice, borrower, "running", timeout=90)
    assert datetime.now(UTC) >= opens
    assert "people-node" in placed_on(job(hub, alice, borrower))[0]
    people = pool(hub, admin, "people")
    assert (people["gpus"], people["borrowed_milli"], people["interactive_milli"]) == (1, 1000, 0)
    assert pool(hub, admin, "peak")["batch_milli"] == 1000
    metrics = hub.api("GET", "/metrics", hub.config["metrics_token"]).text
    assert 'gpuslice_split_pool_allocated_milli{pool="people",use="borrowed"} 1000.0' in metrics
    assert "gpuslice_split_pool_borrowing_open 1.0" in metrics
    wait_for(lambda: loop_checkpoint_written(job_dir(hub, borrower)), 40, "a first checkpoint")

    # the window closes: checkpointed, requeued, and it waits beside the free reserved GPU
    j = wait_state(hub, alice, borrower, "queued", timeout=150)
    assert datetime.now(UTC) >= opens + timedelta(seconds=90)
    assert [t["state"] for t in j["transitions"]][-3:] == ["preempting", "preempted", "queued"]
    assert j["transitions"][-3]["reason"] == (
        "the reserved pool people is returned to interactive use: its borrowing window "
        f"{span(opens, 90)} (UTC) closed (by scheduler)"
    )
    assert j["preemptions"] == 1 and j["lost_work_seconds"] < 5
    wait_for(
        lambda: (
            "1 more free in reserved pool(s) people, kept for interactive use"
            in (job(hub, alice, borrower)["waiting_reason"] or "")
        ),
        30,
        "the job to say the reserved GPU is kept for people",
    )
    assert pool(hub, admin, "people")["borrowed_milli"] == 0
    # people see the reserved GPU free; the submit dialog sees none for batch
    (gpu1,) = hub.api("GET", "/api/profiles", alice).json()["profiles"]
    assert (gpu1["free"], gpu1["reserved_free"]) == (1, 1)
    assert (gpu1["batch_free"], gpu1["batch_total"]) == (0, 1)

    # the peak pool has room again: the job resumes there from its checkpoint
    assert hub.api("DELETE", f"/api/jobs/{normal['id']}", alice).status_code == 200
    j = wait_state(hub, alice, borrower, "running", timeout=90)
    assert "peak-node" in placed_on(j)[-1]
    assert hub.api("DELETE", f"/api/jobs/{borrower}", alice).status_code == 200
