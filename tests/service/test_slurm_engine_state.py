"""The engine's word wins (issue 46): on a real two-node Slurm (``slurm_nodes``) the ledger
never offers a node Slurm starts nothing new on (draining, in a maintenance reservation),
mirrored by the service's own Slurm loop; a grant it does make is one Slurm runs; and the
burst partition's node is no part of this cluster's inventory (``slurm_burst``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gpuslice_hub.errors import Refused
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.slurmsync import run_slurm_sync
from gpuslice_spawner.form import render_form
from gpuslice_spawner.launchers.slurm import SlurmGres
from tests.harness.hub import wait_for
from tests.harness.slurm import A100, SlurmCluster
from tests.harness.slurm_nodes import BURST_NODES, node_hosts
from tests.service.conftest import build_ledger

pytestmark = [pytest.mark.slurm]

GRES = SlurmGres(gpu_types={A100: "a100"})
PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "display_name": "Small MIG"},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
]
HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'
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
