"""The engine's word wins (issue 46): on a real two-node Slurm (``slurm_nodes``) the ledger
never offers a node Slurm starts nothing new on (draining, in a maintenance reservation),
mirrored by the service's own Slurm loop; a grant it does make is one Slurm runs; shares
are whole numbers of Slurm's shards, so shares and whole GPUs are never booked twice; and
the burst partition's node is no part of this cluster's inventory (``slurm_burst``)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.backends.slurm import SlurmBackend
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.profiles import parse_profiles
from gpuslice_hub.slurmsync import run_slurm_sync
from gpuslice_spawner.form import render_form
from gpuslice_spawner.launchers.slurm import SlurmGres, sbatch_options
from tests.harness.hub import wait_for
from tests.harness.slurm import A100, SlurmCluster
from tests.harness.slurm_nodes import BURST_NODES, node_hosts
from tests.service.conftest import build_ledger

pytestmark = [pytest.mark.slurm]

GRES = SlurmGres(gpu_types={A100: "a100"})
PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "display_name": "Small MIG"},
    {"name": "gpu-1", "kind": "gpu", "count": 1, "models": [A100]},
    {"name": "share-375", "kind": "share", "gpu_milli": 375},
    {"name": "share-300", "kind": "share", "gpu_milli": 300},
]
HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'
STARTED = 'touch "$SLURM_JOB_ID.started"\n'
ALICE = Caller("alice", (), "alice")
log = logging.getLogger("test-slurm-engine-state")


@pytest.fixture
async def mirrored(
    slurm_nodes: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Ledger, Callable[[], Awaitable[None]]]]:
    """A ledger of the two nodes, kept by the service's Slurm loop (every 0.1 s), and a
    wait for two of its passes: the second began after the first ended, so after whatever
    the test changed in Slurm before the wait."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_nodes.conf))
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=node_hosts())
    passes = 0
    moved = asyncio.Event()

    def synced() -> None:
        nonlocal passes
        passes += 1
        moved.set()

    async def two_passes() -> None:
        target = passes + 2
        while passes < target:
            moved.clear()
            await asyncio.wait_for(moved.wait(), 30)

    task = asyncio.ensure_future(run_slurm_sync(ledger, 0.1, GRES, log, synced))
    try:
        await two_passes()
        yield ledger, two_passes
    finally:
        task.cancel()
        slurm_nodes.cancel_all()
        slurm_nodes.run("scontrol", "delete", "reservationname=gs-maint", check=False)
        for node in ("gsn1", "gsn2"):
            slurm_nodes.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        ledger.db.dispose()


def node_state(slurm: SlurmCluster, node: str) -> str:
    return slurm.run(
        "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T"
    ).stdout.split()[0]


def offered(ledger: Ledger, profile: str) -> dict:
    return next(p for p in ledger.availability("alice", ()) if p["name"] == profile)


async def test_a_draining_node_and_a_maintenance_reservation_are_never_offered(
    slurm_nodes: SlurmCluster, mirrored: tuple[Ledger, Callable[[], Awaitable[None]]]
):
    ledger, two_passes = mirrored
    assert offered(ledger, "mig-1g.10gb")["total"] == 2

    # gsn1 drains while a colleague's job still runs there: Slurm starts nothing new on it
    busy = slurm_nodes.sbatch(HOLD, "--nodelist=gsn1", "--gres=gpu:a100:1")
    slurm_nodes.wait_state(busy, "RUNNING", timeout=60)
    slurm_nodes.run("scontrol", "update", "nodename=gsn1", "state=drain", "reason=disk swap")
    await two_passes()
    mig = offered(ledger, "mig-1g.10gb")
    assert (mig["free"], mig["total"]) == (1, 1)  # counted out, and said why
    assert mig["out_of_service"] == (
        "1 more on nodes that take no new work now (gsn1: draining in Slurm: disk swap)"
    )
    # the spawn form shows the counts and, beside them, why there are no more
    form = render_form(ledger.availability("alice", ()))
    assert "1 of 1 free" in form and "(gsn1: draining in Slurm: disk swap)" in form
    grant, _ = ledger.allocate(ALICE, "mig-1g.10gb", "one")
    assert grant["host"] == "gsn2"
    with pytest.raises(Refused) as e:
        ledger.allocate(ALICE, "mig-1g.10gb", "two")
    assert "gsn1: draining in Slurm: disk swap" in e.value.message
    # what was granted is what Slurm runs: a job pinned where the grant is starts at once
    pinned = slurm_nodes.sbatch("true\n", f"--nodelist={grant['host']}", "--gres=gpu:1g.10gb:1")
    slurm_nodes.wait_state(pinned, "COMPLETED", timeout=60)

    # gsn1 back in service, gsn2 under a maintenance reservation: the other way round
    slurm_nodes.run("scontrol", "update", "nodename=gsn1", "state=resume")
    # (slurmctld pings a resumed node and calls it not responding until it answers)
    wait_for(lambda: node_state(slurm_nodes, "gsn1") == "mixed", 30, "gsn1 in service")
    slurm_nodes.run(
        "scontrol", "create", "reservation", "reservationname=gs-maint", "starttime=now",
        "duration=10", "nodes=gsn2", "flags=maint", "users=root",
    )  # fmt: skip
    await two_passes()
    ledger.release(grant["id"], "alice", "test")
    grant, _ = ledger.allocate(ALICE, "mig-1g.10gb", "three")
    assert grant["host"] == "gsn1"
    with pytest.raises(Refused) as e:
        ledger.allocate(ALICE, "mig-1g.10gb", "four")
    assert "gsn2: in Slurm's maintenance reservation gs-maint" in e.value.message
    pinned = slurm_nodes.sbatch("true\n", f"--nodelist={grant['host']}", "--gres=gpu:1g.10gb:1")
    slurm_nodes.wait_state(pinned, "COMPLETED", timeout=60)

    # the reservation ends: gsn2 is offered again, within a pass
    slurm_nodes.run("scontrol", "delete", "reservationname=gs-maint")
    await two_passes()
    assert offered(ledger, "mig-1g.10gb")["total"] == 2
    assert "out_of_service" not in offered(ledger, "mig-1g.10gb")
    (slurm_nodes.root / "jobs" / f"{busy}.release").touch()


def test_the_burst_partitions_node_is_not_this_clusters_capacity(
    slurm_burst: SlurmCluster, monkeypatch: pytest.MonkeyPatch
):
    from traitlets.config import Config

    from gpuslice_hub.app import GPUSliceService

    monkeypatch.setenv("SLURM_CONF", str(slurm_burst.conf))
    config = Config()
    config.GPUSliceService.gpu_backend = "slurm"
    config.GPUSliceService.job_backend = "slurm"
    config.SlurmGresConfig.gpu_gres_types = {A100: "a100"}
    config.JobManager.burst_partition = "cloud"
    home, _cloud = BURST_NODES
    inventory = GPUSliceService(config=config).discover()
    assert [h.name for h in inventory.hosts] == [home]


def test_a_share_that_is_no_whole_number_of_shards_is_refused_at_start(tmp_path: Path):
    from gpuslice_hub.app import GPUSliceService
    from gpuslice_hub.errors import ConfigError

    config = tmp_path / "gpuslice_config.py"
    config.write_text(
        'c.GPUSliceService.gpu_backend = "simulated"\n'
        'c.GPUSliceService.job_backend = "slurm"\n'
        "c.SlurmGresConfig.shards_per_gpu = 8\n"
        "c.GPUSliceService.profiles = [\n"
        '    {"name": "share-250", "kind": "share", "gpu_milli": 250},\n'
        '    {"name": "share-300", "kind": "share", "gpu_milli": 300},\n'
        "]\n"
    )
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config_file=str(config)).load_settings()
    assert e.value.key == "profiles[1].gpu_milli"
    assert str(e.value).endswith(
        "profile share-300: a share of 300 milli-GPU is no whole number of Slurm's shard units "
        "(8 per GPU, each 125 milli-GPU); the nearest that are: 250 (2 shards) or 375 (3 shards)"
    )


async def test_shares_and_whole_gpus_are_never_booked_twice(
    slurm_nodes: SlurmCluster, mirrored: tuple[Ledger, Callable[[], Awaitable[None]]]
):
    """Three shares of 3 of a GPU's 8 shards, then a whole GPU, on two nodes of one sharded
    A100 each: every grant the ledger makes runs in Slurm where it is pinned (the spawner's
    own sbatch options), and the whole GPU is refused while Slurm has none to run it."""
    ledger, two_passes = mirrored
    # the share-300 (which the service now refuses at start) asked for 3 shards,
    # 375 milli, while the ledger charged 300: its grant is never submitted
    odd, _ = ledger.allocate(ALICE, "share-300", "odd")
    with pytest.raises(ValueError, match=r"nearest that are: 250 \(2 shards\) or 375"):
        sbatch_options(odd, GRES)
    ledger.release(odd["id"], "alice", "its job could not be submitted")

    grants = [ledger.allocate(ALICE, "share-375", f"s{i}")[0] for i in range(3)]
    assert [g["assignments"][0]["milli"] for g in grants] == [375] * 3  # 3 shards' worth
    jobs = [slurm_nodes.sbatch(HOLD, *sbatch_options(g, GRES)) for g in grants]
    for job, g in zip(jobs, grants, strict=True):
        info = slurm_nodes.wait_state(job, "RUNNING", timeout=60)
        assert (info["NodeList"], info["TresPerNode"]) == (g["host"], "gres:shard:3")
    # no A100 is whole in the ledger, nor in Slurm: a whole-GPU job waits for resources
    with pytest.raises(Refused):
        ledger.allocate(ALICE, "gpu-1", "whole")
    whole = slurm_nodes.sbatch(HOLD, "--gres=gpu:a100:1")
    wait_for(
        lambda: slurm_nodes.job_info(whole)["Reason"] not in ("None", ""),
        30,
        "Slurm to look at the whole-GPU job",
    )
    assert slurm_nodes.job_info(whole)["JobState"] == "PENDING"
    slurm_nodes.run("scancel", whole)
    # the mirror takes none of gpuslice's own shares for a job outside it
    await two_passes()
    assert [a for a in ledger.allocations() if a["purpose"] == "external"] == []

    # the share alone on its node ends: its A100 is whole again in both
    alone = next(g for g in grants if sum(h["host"] == g["host"] for h in grants) == 1)
    (slurm_nodes.root / "jobs" / f"{jobs[grants.index(alone)]}.release").touch()
    slurm_nodes.wait_state(jobs[grants.index(alone)], "COMPLETED", timeout=30)
    ledger.release(alone["id"], "alice", "test")
    gpu, _ = ledger.allocate(ALICE, "gpu-1", "whole")
    assert gpu["host"] == alone["host"]
    pinned = slurm_nodes.sbatch("true\n", *sbatch_options(gpu, GRES))
    slurm_nodes.wait_state(pinned, "COMPLETED", timeout=60)
    for job in jobs:
        (slurm_nodes.root / "jobs" / f"{job}.release").touch()


def eligible(slurm: SlurmCluster, job: str) -> str:
    return slurm.job_info(job)["EligibleTime"]


def test_an_admins_deferral_stays_and_a_class_account_and_reservation_reach_squeue(
    slurm_nodes: SlurmCluster, tmp_path: Path
):
    """Slurm's own hold after a requeue is lifted, an admin's ``StartTime`` is not (it is
    the reason the job waits); a class's ``--account`` and ``--reservation`` are what
    Slurm shows. (sacct needs slurmdbd, which the test cluster does not run: squeue.)"""
    backend = SlurmBackend(
        sys.executable,
        gres=GRES,
        env=slurm_nodes.env,
        accounts={"normal": "physics"},
        reservations={"normal": "gs-batch"},
    )
    slurm_nodes.run(
        "scontrol", "create", "reservation", "reservationname=gs-batch", "starttime=now",
        "duration=10", "nodes=gsn1", "users=root",
    )  # fmt: skip
    try:
        # a colleague's job takes gsn2's instance (gsn1's is the reservation's)
        other = slurm_nodes.sbatch(STARTED + HOLD, "--nodelist=gsn2", "--gres=gpu:1g.10gb:1")
        started = slurm_nodes.root / "jobs" / f"{other}.started"
        # (its script runs: a requeue while slurmd still launches it can fail the job)
        wait_for(started.exists, 60, f"job {other}'s script to run")
        started.unlink()
        # requeued (as a preemption would): Slurm's own hold, lifted at the next poll
        slurm_nodes.run("scontrol", "requeue", other)
        held = slurm_nodes.wait_state(other, "PENDING", timeout=30)
        assert held["Reason"] == "BeginTime"
        status = backend.poll({"slurm_job_id": other})
        assert status.waiting == "pending in Slurm (BeginTime)"
        # ... but not in the requeue's own second: slurmd refuses a launch credential made
        # then ("Job credential revoked"), and the job FAILED (seen in CI)
        info = slurm_nodes.job_info(other)
        lifted = datetime.fromisoformat(info["EligibleTime"])
        assert lifted >= datetime.fromisoformat(info["SubmitTime"]) + timedelta(seconds=2), info
        slurm_nodes.wait_state(other, "RUNNING", timeout=60)  # not two minutes later
        wait_for(started.exists, 60, f"job {other}'s script to run again")

        # a gpuslice job of a class without a reservation waits for that instance; an
        # admin defers it by two hours (as root): it stays deferred, and says so
        (mig,) = [p for p in parse_profiles(PROFILES).values() if p.name == "mig-1g.10gb"]
        # (job ids no hub test's jobs have: their Slurm names stay in squeue a while)
        (tmp_path / "j1").mkdir()
        waits = backend.submit(9001, str(tmp_path / "j1"), {}, mig, 1, "preemptible")
        job = waits["slurm_job_id"]
        wait_for(lambda: slurm_nodes.job_info(job)["Reason"] == "Resources", 30, "job 1 to wait")
        slurm_nodes.run("scontrol", "update", f"jobid={job}", "StartTime=now+2hours")
        wait_for(
            lambda: slurm_nodes.job_info(job)["Reason"] == "BeginTime", 30, "Slurm to defer it"
        )
        later = eligible(slurm_nodes, job)
        for _ in range(2):  # (the old code set StartTime=now at the first)
            status = backend.poll(waits)
        assert eligible(slurm_nodes, job) == later
        assert status.waiting == (f"pending in Slurm (BeginTime): deferred in Slurm until {later}")
        # ... as is a requeued job an admin deferred past Slurm's own hold
        slurm_nodes.run("scontrol", "requeue", other)
        slurm_nodes.wait_state(other, "PENDING", timeout=30)
        slurm_nodes.run("scontrol", "update", f"jobid={other}", "StartTime=now+2hours")
        wait_for(lambda: slurm_nodes.job_info(other)["Reason"] == "BeginTime", 30, "the deferral")
        later = eligible(slurm_nodes, other)
        status = backend.poll({"slurm_job_id": other})
        assert eligible(slurm_nodes, other) == later
        assert status.waiting.endswith(f"deferred in Slurm until {later}")

        # a job of a class with an account and a reservation: Slurm shows both, and runs it
        # on the reservation's node
        (tmp_path / "j2").mkdir()
        ref = backend.submit(9002, str(tmp_path / "j2"), {}, mig, 1, "normal")
        shown = slurm_nodes.run(
            "squeue", "--noheader", "--states=all", f"--jobs={ref['slurm_job_id']}",
            "--Format=Account:|,Reservation:|,NodeList:|",
        ).stdout.strip()  # fmt: skip
        assert shown.split("|")[:2] == ["physics", "gs-batch"]
        info = slurm_nodes.wait_state(
            ref["slurm_job_id"], ("RUNNING", "COMPLETED", "FAILED"), timeout=60
        )
        assert info["NodeList"] == "gsn1"
    finally:
        # (Slurm keeps a reservation while jobs run in it: the next test's jobs would wait)
        slurm_nodes.cancel_all()
        slurm_nodes.run("scontrol", "delete", "reservationname=gs-batch")
