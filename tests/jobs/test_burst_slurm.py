"""Burst on a real Slurm with two partitions (``slurm_burst``: ``batch`` on gsb1, ``cloud``
on gsb2): a burstable job that waits too long in its own partition is moved to the burst
partition by the service and runs there, held nowhere in this cluster's ledger and counted
as bought GPU-hours; a job that is not burstable stays; a burst job requeued there comes
back to its own partition's queue."""

from __future__ import annotations

import pytest

from tests.harness.hub import Hub, wait_for
from tests.harness.slurm import A100, SlurmCluster
from tests.harness.slurm_nodes import BURST_NODES, node_hosts
from tests.jobs.test_jobs_hub import job, submit, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.hub]

HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'
PROFILES = [{"name": "gpu-1", "kind": "gpu", "count": 1}]
# a few seconds: the service's pass (every second) sees it run
QUICK = ["import json, time\ntime.sleep(4)", "print('RESULT', json.dumps({'ok': True}))"]
SLOW = ["import time", "time.sleep(600)"]


def slurm_job(slurm: SlurmCluster, job_id: int) -> dict[str, str]:
    """The Slurm record of gpuslice's job ``job_id``."""
    out = slurm.run("squeue", "--states=all", "-h", "-o", "%i %j").stdout.splitlines()
    (line,) = [x for x in out if x.split()[1] == f"gpuslice-{job_id}"]
    return slurm.job_info(line.split()[0])


def batch_allocations(hub: Hub) -> list[dict]:
    r = hub.api("GET", "/api/allocations", hub.service_token)
    assert r.status_code == 200, r.text
    return [a for a in r.json()["allocations"] if a["purpose"] == "batch"]


def test_a_waiting_burstable_job_runs_in_the_burst_partition_and_comes_back_when_requeued(
    slurm_burst: SlurmCluster, hub_factory
):
    env = {k: v for k, v in slurm_burst.env.items() if k.startswith("SLURM") or k == "PATH"}
    hub = hub_factory(
        # this site's inventory is its own partition's node; the burst node is not its own
        hosts=node_hosts(BURST_NODES[:1]),
        profiles=PROFILES,
        extra_service_config=(
            f"import os\nos.environ.update({env!r})\n"
            "c.GPUSliceService.job_backend = 'slurm'\n"
            f"c.SlurmGresConfig.gpu_gres_types = {{{A100!r}: 'a100'}}\n"
            "c.JobManager.slurm_partitions = "
            "{'preemptible': 'batch', 'normal': 'batch', 'high': 'batch'}\n"
            "c.JobManager.burst_partition = 'cloud'\n"
            "c.JobManager.burst_after_wait = 0.01\n"
            "c.JobManager.burst_when_allocated_above = 0.0\n"
        ),
    )
    alice = hub.add_user("alice")

    # a colleague's job holds both GPUs of this site's partition (its A100 and its 1g.10gb)
    foreign = slurm_burst.sbatch(HOLD, "--gres=gpu:2", "--partition=batch")
    slurm_burst.wait_state(foreign, "RUNNING", timeout=60)

    # burstable, 10 minutes expected: moved after 6 s of waiting, runs on gsb2
    r = submit(hub, alice, cells=QUICK, max_runtime=600, burstable=True)
    assert r.status_code == 201, r.text
    first = r.json()["id"]
    # not burstable: waits in batch whatever happens
    r = submit(hub, alice, cells=QUICK, max_runtime=600)
    assert r.status_code == 201, r.text
    stays = r.json()["id"]

    done = wait_state(hub, alice, first, ("completed", "failed"), timeout=120)
    assert done["state"] == "completed", done
    reasons = [t["reason"] for t in done["transitions"]]
    assert "Slurm started it on gsb2 in the burst partition cloud" in reasons, reasons
    # one GPU for the run's few seconds there
    assert done["bursts"] == 1 and done["burstable"]
    assert 3 / 3600 < done["burst_gpu_hours"] < 120 / 3600, done
    info = slurm_job(slurm_burst, first)
    assert (info["Partition"], info["NodeList"]) == ("cloud", "gsb2")
    # it held nothing in this cluster's ledger
    assert not [a for a in batch_allocations(hub) if a["server_name"] == f"job-{first}"]

    waiting = job(hub, alice, stays)
    assert waiting["state"] == "queued" and waiting["bursts"] == 0, waiting
    assert slurm_job(slurm_burst, stays)["Partition"] == "batch"
    assert hub.api("DELETE", f"/api/jobs/{stays}", alice).status_code == 200

    # a long one, 50 minutes expected: moved after 30 s, then requeued in the burst
    # partition (its spot instance taken back): it comes back to batch's queue
    r = submit(hub, alice, cells=SLOW, max_runtime=3000, burstable=True)
    assert r.status_code == 201, r.text
    second = r.json()["id"]
    running = wait_state(hub, alice, second, "running", timeout=120)
    assert running["on_burst"], running
    slurm_id = slurm_job(slurm_burst, second)["JobId"]
    slurm_burst.run("scontrol", "requeue", slurm_id)

    def back_home() -> dict | None:
        j = job(hub, alice, second)
        return j if j["state"] == "queued" and not j["on_burst"] else None

    back = wait_for(back_home, 60, "the requeued job back in its own partition")
    assert "back in batch's queue" in back["log_tail"], back
    assert slurm_job(slurm_burst, second)["Partition"] == "batch"
    assert back["bursts"] == 1 and back["burst_gpu_hours"] > 0
    assert hub.api("DELETE", f"/api/jobs/{second}", alice).status_code == 200
    (slurm_burst.root / "jobs" / f"{foreign}.release").touch()
