"""gpuslice on a real two-node Slurm (``slurm_nodes``): jobs that never came through
gpuslice hold GPUs the service then never offers, on the node they hold them, also for a
job spanning both nodes; and gpuslice's own batch job runs where Slurm puts it, recorded
in the ledger on that node."""

from __future__ import annotations

import pytest

from tests.harness.hub import Hub, wait_for
from tests.harness.slurm import A100, SlurmCluster
from tests.harness.slurm_nodes import node_hosts
from tests.jobs.test_jobs_hub import submit, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.hub]

HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'
PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
]


def external(hub: Hub) -> list[tuple[str, str]]:
    r = hub.api("GET", "/api/allocations", hub.service_token)
    assert r.status_code == 200, r.text
    return sorted(
        (a["host"], a["server_name"]) for a in r.json()["allocations"] if a["purpose"] == "external"
    )


def release(slurm: SlurmCluster, *jobs: str) -> None:
    for job in jobs:
        (slurm.root / "jobs" / f"{job}.release").touch()
    for job in jobs:
        slurm.wait_state(job, "COMPLETED", timeout=30)


def test_foreign_jobs_are_held_per_node_and_gpuslice_jobs_are_recorded_where_slurm_runs_them(
    slurm_nodes: SlurmCluster, hub_factory
):
    env = {k: v for k, v in slurm_nodes.env.items() if k.startswith("SLURM") or k == "PATH"}
    hub = hub_factory(
        hosts=node_hosts(),
        profiles=PROFILES,
        extra_service_config=(
            f"import os\nos.environ.update({env!r})\n"
            "c.GPUSliceService.job_backend = 'slurm'\n"
            "c.GPUSliceService.slurm_sync_interval = 1\n"
            f"c.SlurmGresConfig.gpu_gres_types = {{{A100!r}: 'a100'}}\n"
        ),
    )
    alice = hub.add_user("alice")

    # A colleague's job takes gsn1's 1g.10gb instance: held there, and only there.
    foreign = slurm_nodes.sbatch(HOLD, "--gres=gpu:1g.10gb:1", "--nodelist=gsn1")
    slurm_nodes.wait_state(foreign, "RUNNING", timeout=60)
    wait_for(lambda: external(hub) == [("gsn1", "gpu:1g.10gb")], 30, "gsn1's instance held")

    # gpuslice's job on that profile goes to Slurm, which runs it on gsn2 (the only free
    # instance), and the ledger records it there.
    cells = ["import json", "print('RESULT', json.dumps({'ok': True}))"]
    r = submit(hub, alice, cells=cells, profile="mig-1g.10gb")
    assert r.status_code == 201, r.text
    job = wait_state(hub, alice, r.json()["id"], ("completed", "failed"), timeout=120)
    assert job["state"] == "completed", job
    assert "Slurm started it on gsn2" in [t["reason"] for t in job["transitions"]]
    (slurm_id,) = [
        j
        for j in slurm_nodes.run("squeue", "--states=all", "-h", "-o", "%i %j").stdout.splitlines()
        if j.split()[1] == f"gpuslice-{job['id']}"
    ]
    info = slurm_nodes.job_info(slurm_id.split()[0])
    assert (info["NodeList"], info["TresPerNode"]) == ("gsn2", "gres:gpu:1g.10gb:1")

    # A job on both nodes (Slurm writes "gsn[1-2]") holds an A100 on each.
    wide = slurm_nodes.sbatch(HOLD, "--nodes=2", "--gres=gpu:a100:1")
    assert slurm_nodes.wait_state(wide, "RUNNING", timeout=60)["NodeList"] == "gsn[1-2]"
    held = [("gsn1", "gpu:1g.10gb"), ("gsn1", "gpu:a100"), ("gsn2", "gpu:a100")]
    wait_for(lambda: external(hub) == held, 30, "an A100 held on each node")
    r = hub.allocate("alice", "gpu-1")
    assert r.status_code == 409 and r.json()["code"] == "no_capacity", r.text

    # Slurm frees them: all offered again.
    release(slurm_nodes, foreign, wide)
    wait_for(lambda: external(hub) == [], 30, "every holding outside gpuslice released")
    r = hub.allocate("alice", "gpu-1")
    assert r.status_code == 201, r.text
