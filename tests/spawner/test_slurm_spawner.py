"""GPUSliceSlurmSpawner through a real JupyterHub and a real single-node Slurm.

The hub, its gpuslice service (simulated GPUs named like the fake Slurm gres), batchspawner,
sbatch/squeue/scancel, slurmd and the single-user server in the job are all real; the job
runs as root on this machine and reaches the hub's API over 127.0.0.1.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.harness.hub import Hub, start_hub, wait_for
from tests.harness.slurm import MARKER_ENV, PROFILES, SlurmCluster, slurm_hosts

pytestmark = [pytest.mark.hub, pytest.mark.slurm]

VENV_BIN = Path(sys.executable).parent

# batchspawner, not gpuslice, needs the import: it registers /hub/api/batchspawner, where
# the job reports the port its server listens on.
HUB_CONFIG = """
import os
import gpuslice_spawner.slurm
os.environ["SLURM_CONF"] = {slurm_conf!r}
c.GPUSliceSlurmSpawner.exec_prefix = ""
c.GPUSliceSlurmSpawner.environment = {{"SLURM_CONF": {slurm_conf!r}, {marker!r}: {marker_value!r}}}
c.GPUSliceSlurmSpawner.home_dir_template = {home!r} + "/{{username}}"
c.GPUSliceSlurmSpawner.batchspawner_singleuser_cmd = {venv_bin!r} + "/batchspawner-singleuser"
c.GPUSliceSlurmSpawner.startup_poll_interval = 0.2
c.GPUSliceSlurmSpawner.req_partition = "interactive"
c.Spawner.cmd = [{venv_bin!r} + "/jupyterhub-singleuser"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60
"""


@pytest.fixture(scope="module")
def slurm_hub(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    workdir = tmp_path_factory.mktemp("slurm-hub")
    home = workdir / "home"
    config = HUB_CONFIG.format(
        slurm_conf=str(slurm_cluster.conf),
        marker=MARKER_ENV,
        marker_value=str(slurm_cluster.root),
        home=str(home),
        venv_bin=str(VENV_BIN),
    )
    hub = start_hub(
        workdir,
        spawner="gpuslice-slurm",
        hosts=slurm_hosts(slurm_cluster.node.name),
        profiles=PROFILES,
        extra_hub_config=config,
        # the service mirrors what Slurm's jobs hold outside gpuslice, every second
        extra_service_config=(
            f"import os\nos.environ['SLURM_CONF'] = {str(slurm_cluster.conf)!r}\n"
            "c.GPUSliceService.slurm_sync_interval = 1\n"
            # batch jobs go to Slurm's queue, preemptible ones in the low-tier partition
            "c.GPUSliceService.job_backend = 'slurm'\n"
            "c.JobManager.slurm_partitions = {'preemptible': 'preemptible'}\n"
        ),
    )
    hub.config["home"] = str(home)
    yield hub
    hub.stop()


def add_user(hub: Hub, name: str) -> None:
    hub.add_user(name)
    Path(hub.config["home"], name).mkdir(parents=True, exist_ok=True)


def job_id_of(hub: Hub, user: str) -> str:
    state = hub.hub_api("GET", f"/users/{user}").json()["servers"][""]["state"]
    return str(state["job_id"])


def job_env(job_id: str) -> dict[str, str]:
    """The environment of the job's single-user server process."""

    def find() -> dict[str, str] | None:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if "jupyterhub-singleuser" not in " ".join(proc.info["cmdline"] or []):
                    continue
                env = proc.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if env.get("SLURM_JOB_ID") == job_id:
                return env
        return None

    return wait_for(find, 30, f"the server process of job {job_id}")


def allocations(hub: Hub, user: str) -> list[dict[str, Any]]:
    r = hub.api("GET", f"/api/allocations?user={user}", hub.service_token)
    assert r.status_code == 200, r.text
    return r.json()["allocations"]


def spawn_and_stop(
    hub: Hub, slurm: SlurmCluster, user: str, profile: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Spawn ``user`` on ``profile``; return the job's scontrol record and server env."""
    add_user(hub, user)
    r = hub.spawn(user, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_ready(user, timeout=120)
    except TimeoutError:
        print(hub.log()[-6000:])
        print(slurm.log_tail())
        raise
    job = job_id_of(hub, user)
    info = slurm.job_info(job)
    env = job_env(job)
    held = allocations(hub, user)
    assert len(held) == 1 and held[0]["profile"] == profile

    r = hub.hub_api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_gone(user)
    wait_for(lambda: job not in slurm.active_jobs(), 30, f"job {job} to leave the queue")
    assert slurm.job_info(job)["JobState"] == "CANCELLED"
    wait_for(lambda: allocations(hub, user) == [], 30, f"{user}'s slice to be released")
    return info, env


def test_mig_spawn_lands_on_the_node_with_the_mig_gres(slurm_hub: Hub, slurm: SlurmCluster):
    info, env = spawn_and_stop(slurm_hub, slurm, "alice", "mig-1g.10gb")
    assert info["JobState"] == "RUNNING"
    assert info["TresPerNode"] == "gres:gpu:1g.10gb:1"
    assert info["NodeList"] == slurm.node.name
    assert info["ReqNodeList"] == slurm.node.name
    assert info["Partition"] == "interactive"
    # Slurm gave the job its 1g.10gb device ...
    assert info["GRES"].startswith("gpu:1g.10gb:1(IDX:"), info
    idx = info["GRES"].split("IDX:")[1].rstrip(")")
    # ... and the server sees that device, not the uuid gpuslice counted
    assert env["CUDA_VISIBLE_DEVICES"] == idx
    assert env["GPUSLICE_PROFILE"] == "mig-1g.10gb"
    assert env["GPUSLICE_HOST"] == slurm.node.name
    assert env["JUPYTERHUB_USER"] == "alice"
    events = slurm_hub.api("GET", "/api/events?user=alice", slurm_hub.service_token).json()
    released = [e for e in events["events"] if e["kind"] == "released"]
    assert len(released) == 1 and released[0]["reason"] == "server stopped"


def test_share_spawn_asks_for_shards(slurm_hub: Hub, slurm: SlurmCluster):
    info, env = spawn_and_stop(slurm_hub, slurm, "bob", "share-250")
    # a quarter of a GPU with 8 shards per GPU
    assert info["TresPerNode"] == "gres:shard:2"
    assert info["ReqNodeList"] == slurm.node.name
    assert env["GPUSLICE_MEMORY_CAP_MIB"] == "20480"
    assert env["SLURM_SHARDS_ON_NODE"] == "2"


HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'


def test_a_gpu_held_by_a_job_outside_gpuslice_is_never_offered(slurm_hub: Hub, slurm: SlurmCluster):
    add_user(slurm_hub, "carol")
    carol = slurm_hub.add_user("carol")
    admin = slurm_hub.add_user("admin")

    def free_mig() -> int:
        r = slurm_hub.api("GET", "/api/profiles", carol)
        assert r.status_code == 200, r.text
        (mig,) = [p for p in r.json()["profiles"] if p["name"] == "mig-1g.10gb"]
        return int(mig["free"])

    wait_for(lambda: free_mig() == 1, 30, "the 1g.10gb instance to be free")
    health = slurm_hub.api("GET", "/api/health").json()
    assert health["slurm_synced"] is not None  # the service reads Slurm
    # ... and checked its hosts against Slurm's nodes: the test cluster shards only one of
    # its two A100s (the other offers MPS), which the inventory cannot say
    mismatch = f"{slurm.node.name}: shard is 16 here and 8 in Slurm's gres"
    assert mismatch in slurm_hub.log()
    # A colleague's job that never came through gpuslice takes the node's only instance.
    foreign = slurm.sbatch(HOLD, "--partition=interactive", "--gres=gpu:1g.10gb:1")
    slurm.wait_state(foreign, "RUNNING", timeout=60)
    wait_for(lambda: free_mig() == 0, 30, "the foreign job's instance to be held")
    r = slurm_hub.allocate("carol", "mig-1g.10gb")
    assert r.status_code == 409 and r.json()["code"] == "no_capacity", r.text
    totals = slurm_hub.api("GET", "/api/admin/overview", admin).json()["totals"]
    assert totals["external_milli"] > 0 and totals["interactive_milli"] == 0
    held = slurm_hub.api("GET", "/api/allocations", slurm_hub.service_token).json()
    (ext,) = [a for a in held["allocations"] if a["purpose"] == "external"]
    assert (ext["host"], ext["server_name"]) == (slurm.node.name, "gpu:1g.10gb")
    # an admin cannot release what Slurm holds (it would be offered while in use)
    r = slurm_hub.api("DELETE", f"/api/allocations/{ext['id']}", admin)
    assert r.status_code == 409 and "held by Slurm" in r.json()["message"], r.text

    # Slurm frees it: gpuslice offers it again, and a spawn on it runs in Slurm.
    (slurm.root / "jobs" / f"{foreign}.release").touch()
    slurm.wait_state(foreign, "COMPLETED", timeout=30)
    wait_for(lambda: free_mig() == 1, 30, "the instance to be offered again")
    info, _ = spawn_and_stop(slurm_hub, slurm, "carol", "mig-1g.10gb")
    assert info["TresPerNode"] == "gres:gpu:1g.10gb:1"
    events = slurm_hub.api("GET", "/api/events?limit=500", slurm_hub.service_token).json()
    mine = sorted(
        (e for e in events["events"] if e.get("allocation_id") == ext["id"]), key=lambda e: e["id"]
    )
    assert [e["kind"] for e in mine] == ["allocated", "released"]
    assert mine[-1]["reason"] == "no longer held in Slurm"


def test_a_spawn_gets_a_batch_jobs_gpu_through_slurms_preemption_and_the_job_resumes(
    slurm_hub: Hub, slurm: SlurmCluster
):
    from tests.jobs.notebooks import TRAIN_CELLS, loop_checkpoint_written
    from tests.jobs.test_jobs_hub import RESULT_CELL, expected_w, output_result, submit, wait_state

    hub = slurm_hub
    dora = hub.add_user("dora")
    Path(hub.config["home"], "dora").mkdir(parents=True, exist_ok=True)
    r = submit(
        hub,
        dora,
        cells=[*TRAIN_CELLS[:3], RESULT_CELL],
        profile="mig-1g.10gb",
        parameters={"steps": 400, "delay": 0.02},
        checkpoint_interval=1,
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_state(hub, dora, job_id, "running", timeout=90)
    (batch,) = [
        j for j in slurm.active_jobs() if slurm.job_info(j)["JobName"] == f"gpuslice-{job_id}"
    ]
    assert slurm.job_info(batch)["Partition"] == "preemptible"
    wait_for(
        lambda: loop_checkpoint_written(hub.workdir / "gpuslice-jobs" / str(job_id)),
        90,
        "the loop's first checkpoint",
    )
    # the mirror of Slurm's holdings takes the job for gpuslice's own, never for a foreign one
    synced = [hub.api("GET", "/api/health").json()["slurm_synced"]]
    for _ in range(2):
        wait_for(
            lambda: (
                (t := hub.api("GET", "/api/health").json()["slurm_synced"]) != synced[-1]
                and synced.append(t) is None
            ),
            30,
            "another pass of the Slurm mirror",
        )
    held = hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"]
    assert [(a["purpose"], a["user"]) for a in held] == [("batch", "dora")]

    # The node's only 1g.10gb instance is the job's. Dora's server takes it: the ledger
    # gives it to the spawn, and Slurm preempts the job for the server's higher partition.
    r = hub.spawn("dora", {"profile": "mig-1g.10gb"})
    if r.status_code not in (201, 202):
        print(hub.log()[-12000:])
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("dora", timeout=120)
    server = job_id_of(hub, "dora")
    assert slurm.job_info(server)["Partition"] == "interactive"
    requeued = slurm.job_info(batch)
    assert requeued["JobState"] in {"PENDING", "REQUEUED"} and int(requeued["Restarts"]) == 1
    job = wait_state(hub, dora, job_id, "queued", timeout=60)
    reasons = [t["reason"] for t in job["transitions"]]
    assert any("Slurm preempts it when that server's job starts" in r for r in reasons), reasons
    assert job["preemptions"] == 1 and "preempted" in [t["state"] for t in job["transitions"]]
    assert [a["purpose"] for a in allocations(hub, "dora")] == ["interactive"]

    # The server stops: Slurm runs the same job again, which resumes from its checkpoint.
    r = hub.hub_api("DELETE", "/users/dora/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_gone("dora")
    done = wait_state(hub, dora, job_id, ("completed", "failed"), timeout=120)
    assert done["state"] == "completed", done
    assert slurm.job_info(batch)["JobState"] == "COMPLETED"  # one Slurm job all along
    result = output_result(hub, dora, job_id)
    assert 0 < result["first_step"] < 400
    np.testing.assert_array_equal(result["w"], expected_w(400, 0.05))


def stream_progress(hub: Hub, user: str) -> tuple[list[dict[str, Any]], threading.Thread]:
    """The hub's progress stream of ``user``'s spawn (server-sent events), read in a thread
    into a list as they come, until it ends."""
    events: list[dict[str, Any]] = []

    def read() -> None:
        r = hub.hub_api("GET", f"/users/{user}/server/progress", stream=True)
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                events.append(json.loads(line[5:]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return events, reader


def test_a_server_waiting_in_slurms_queue_says_so_on_the_progress_page(
    slurm_hub: Hub, slurm: SlurmCluster
):
    """The progress page said "Starting your server" while the job waited in Slurm's queue:
    batchspawner's "Pending in queue..." never reached it (issue 46). A job that did not
    come through gpuslice takes the whole node (no GPU: gpuslice still grants the slice),
    so the server's job waits for it."""
    hub = slurm_hub
    add_user(hub, "erin")
    blocker = slurm.sbatch(HOLD, "--partition=interactive", "--exclusive")
    slurm.wait_state(blocker, "RUNNING", timeout=60)
    r = hub.spawn("erin", {"slice": "share-250"})
    assert r.status_code == 202, r.text
    events, reader = stream_progress(hub, "erin")
    said = lambda: [e.get("message", "") for e in events]  # noqa: E731
    wait_for(lambda: "Pending in queue..." in said(), 60, "batchspawner's queue message")
    server = job_id_of(hub, "erin")
    assert slurm.job_info(server)["JobState"] == "PENDING"

    (slurm.root / "jobs" / f"{blocker}.release").touch()  # the node is free again
    hub.wait_ready("erin", timeout=120)
    reader.join(30)
    assert not reader.is_alive(), "the progress stream did not end"
    messages = said()
    got = next(i for i, m in enumerate(messages) if m.startswith("Got share-250 on"))
    pending = messages.index("Pending in queue...")
    assert got < messages.index("Starting your server") < pending
    assert events[-1]["ready"] is True
    bar = [e["progress"] for e in events if "progress" in e]
    assert bar == sorted(bar)  # never back
    r = hub.hub_api("DELETE", "/users/erin/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_gone("erin")
    wait_for(lambda: allocations(hub, "erin") == [], 30, "erin's slice to be released")
