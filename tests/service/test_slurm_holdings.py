"""What Slurm's jobs hold outside gpuslice is held in the ledger and never offered.

Reading: ``squeue --json`` as Slurm 22.05 prints it (the job fields recorded from the test
cluster: ``job_state``, ``nodes``, ``gres_detail``). Keeping: the ledger on SQLite and
PostgreSQL, holdings added, kept, re-placed and released as Slurm's figures change."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from gpuslice_hub.api.admin import quota_holdings
from gpuslice_hub.errors import Refused
from gpuslice_hub.ledger import Caller
from gpuslice_hub.slurmsync import check_nodes, sync_once
from gpuslice_hub.slurmusage import (
    SlurmReadError,
    configured_gres,
    expand_hostlist,
    held_by_jobs,
    parse_gres_detail,
    steady,
)
from gpuslice_spawner.launchers.slurm import SlurmGres

ANN = Caller("ann", (), "ann")
A100 = "NVIDIA A100-SXM4-80GB"
GRES = SlurmGres(gpu_types={A100: "a100"}, shards_per_gpu=8)


def test_hostlists_expand_like_slurm():
    assert expand_hostlist("vm") == ["vm"]
    assert expand_hostlist("gpu[01-03,07],login") == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert expand_hostlist("a[1-2]-ib[0-1]") == ["a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1"]
    with pytest.raises(ValueError):
        expand_hostlist("gpu[01-")


def test_gres_details_count_per_gres_without_indexes():
    assert parse_gres_detail("gpu:1g.10gb:1(IDX:2)") == Counter({"gpu:1g.10gb": 1})
    assert parse_gres_detail("gpu:a100:2(IDX:0,3),shard:3(IDX:1)") == Counter(
        {"gpu:a100": 2, "shard": 3}
    )
    # a share's type is dropped: gpuslice asks for shares untyped
    assert parse_gres_detail("shard:a100:2(IDX:0)") == Counter({"shard": 2})
    assert parse_gres_detail("gpu:1(IDX:0)") == Counter({"gpu": 1})
    assert parse_gres_detail("") == Counter()


def test_only_jobs_that_hold_an_allocation_count_on_each_of_their_nodes():
    squeue = {
        "jobs": [
            {
                "job_id": 1,
                "job_state": "RUNNING",
                "nodes": "vm",
                "gres_detail": ["gpu:1g.10gb:1(IDX:2)"],
            },
            {"job_id": 2, "job_state": "RUNNING", "nodes": "vm", "gres_detail": ["shard:3(IDX:0)"]},
            {"job_id": 3, "job_state": "PENDING", "nodes": "", "gres_detail": []},
            {
                "job_id": 4,
                "job_state": "COMPLETED",
                "nodes": "vm",
                "gres_detail": ["gpu:a100:1(IDX:0)"],
            },
            {
                "job_id": 5,
                "job_state": "RUNNING",
                "nodes": "n[1-2]",
                "gres_detail": ["gpu:a100:2(IDX:0-1)", "gpu:a100:1(IDX:0)"],
            },
            {"job_id": 6, "job_state": "RUNNING", "nodes": "vm", "gres_detail": []},  # CPU only
        ]
    }
    assert held_by_jobs(squeue) == {
        "vm": Counter({"gpu:1g.10gb": 1, "shard": 3}),
        "n1": Counter({"gpu:a100": 2}),
        "n2": Counter({"gpu:a100": 1}),
    }


def test_gpuslices_own_batch_jobs_are_left_out_by_their_slurm_ids():
    squeue = {
        "jobs": [
            {"job_id": 7, "job_state": "RUNNING", "nodes": "vm", "gres_detail": ["gpu:1(IDX:0)"]},
            {"job_id": 8, "job_state": "RUNNING", "nodes": "vm", "gres_detail": ["gpu:1(IDX:1)"]},
        ]
    }
    assert held_by_jobs(squeue, exclude={"7"}) == {"vm": Counter({"gpu": 1})}


def test_a_holding_counts_once_two_reads_agree_and_ends_at_once():
    before = {"vm": Counter({"gpu:1g.10gb": 1, "shard": 2}), "gone": Counter({"gpu": 1})}
    now = {"vm": Counter({"gpu:1g.10gb": 2, "shard": 1}), "new": Counter({"gpu": 1})}
    assert steady(before, now) == {"vm": Counter({"gpu:1g.10gb": 1, "shard": 1})}


def free(ledger, profile: str) -> int:
    return ledger.profile_capacity()[profile][0]


def external(ledger) -> list[dict]:
    return [a for a in ledger.allocations() if a["purpose"] == "external"]


def test_a_foreign_jobs_mig_instance_is_held_and_given_back(make_ledger):
    ledger = make_ledger()
    before = free(ledger, "mig-1g.10gb")
    assert ledger.sync_external({"node-a": Counter({"gpu:1g.10gb": 1})}, GRES)[:2] == (1, 0)
    (held,) = external(ledger)
    assert held["host"] == "node-a" and held["user"] == "" and held["kind"] == "mig"
    assert held["assignments"][0]["mig_profile"] == "1g.10gb"
    assert free(ledger, "mig-1g.10gb") == before - 1
    # no quota counts it: the admin panel's quota table has no row (a blank user) for it
    assert quota_holdings(ledger.snapshot()[2]) == ({}, {})
    # the same figure again changes nothing (no churn of allocations and events)
    assert ledger.sync_external({"node-a": Counter({"gpu:1g.10gb": 1})}, GRES)[:2] == (0, 0)
    # nobody releases it but the mirror: an admin's release would offer a device in use
    with pytest.raises(Refused) as refused:
        ledger.release(held["id"], "admin", "cleanup")
    assert refused.value.code == "wrong_state" and "held by Slurm" in refused.value.message
    assert len(external(ledger)) == 1
    # the instances left are still gpuslice's to offer; past them: no capacity
    for n in range(before - 1):
        ledger.allocate(ANN, "mig-1g.10gb", f"s{n}")
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "mig-1g.10gb", "one-too-many")
    assert info.value.code == "no_capacity"
    # the foreign job ended: its instance is offered again
    assert ledger.sync_external({}, GRES)[:2] == (0, 1)
    assert external(ledger) == []
    ledger.allocate(ANN, "mig-1g.10gb", "now-it-fits")


def test_gpuslices_own_slices_explain_what_slurm_reports_for_them(make_ledger):
    ledger = make_ledger()
    ledger.allocate(ANN, "mig-1g.10gb", "lab")  # its server's job holds gpu:1g.10gb in Slurm
    ledger.allocate(ANN, "gpu-1", "big")  # untyped in the grant, typed in Slurm's report
    held = {"node-a": Counter({"gpu:1g.10gb": 1, "gpu:a100": 1})}
    assert ledger.sync_external(held, SlurmGres(shards_per_gpu=8))[:2] == (0, 0)
    # one more of each than gpuslice holds: those are foreign
    held = {"node-a": Counter({"gpu:1g.10gb": 2, "gpu:a100": 2})}
    assert ledger.sync_external(held, SlurmGres(shards_per_gpu=8))[:2] == (2, 0)
    kinds = sorted(a["kind"] for a in external(ledger))
    assert kinds == ["gpu", "mig"]


def test_batch_slices_matched_by_id_explain_no_other_job(make_ledger):
    """Slurm schedules the batch jobs: the job pass records them by Slurm id and the read
    leaves them out, so a batch slice never explains a foreign job's device, and a job
    whose slice was given to a server is not taken for a foreign one."""
    ledger = make_ledger()
    ledger.record_placed(ANN, "mig-1g.10gb", "node-a", "job-1")
    held = {"node-a": Counter({"gpu:1g.10gb": 1})}  # a foreign job's instance, not job 1's
    assert ledger.sync_external(held, GRES)[:2] == (0, 0)  # counted: explained by job 1
    assert ledger.sync_external(held, GRES, batch_by_id=True)[:2] == (1, 0)
    assert [a["host"] for a in external(ledger)] == ["node-a"]


def test_foreign_shards_hold_their_share_of_a_gpu_rounded_up(make_ledger):
    ledger = make_ledger()
    share_free = free(ledger, "share-250")
    ledger.sync_external({"node-a": Counter({"shard": 3})}, GRES)
    (held,) = external(ledger)
    assert (held["kind"], held["gpu_milli"]) == ("share", 375)  # 3 of 8 shards, rounded up
    assert free(ledger, "share-250") < share_free
    # fewer shards: placed again at the new size, not left over-held
    assert ledger.sync_external({"node-a": Counter({"shard": 2})}, GRES)[:2] == (1, 1)
    (held,) = external(ledger)
    assert held["gpu_milli"] == 250


def test_nodes_the_ledger_does_not_know_and_missing_devices_are_reported_not_invented(
    make_ledger,
):
    ledger = make_ledger()
    added, released, problems = ledger.sync_external(
        {"login01": Counter({"gpu:a100": 4}), "node-a": Counter({"gpu:7g.80gb": 1})}, GRES
    )
    assert (added, released) == (0, 0)
    assert problems and "node-a" in problems[0] and "gpu:7g.80gb" in problems[0]


def test_a_failed_read_keeps_what_slurm_held(make_ledger, caplog):
    ledger = make_ledger()
    ledger.sync_external({"node-a": Counter({"gpu:1g.10gb": 1})}, GRES)

    def broken() -> dict:
        raise SlurmReadError("squeue failed: slurmctld is down")

    log = logging.getLogger("test")
    with pytest.raises(SlurmReadError):
        asyncio.run(sync_once(ledger, GRES, log, read=broken))
    assert len(external(ledger)) == 1

    two = {"node-a": Counter({"gpu:1g.10gb": 2})}

    async def passes(*reads: dict) -> list[tuple[int, int]]:
        before, out = None, []
        for held in reads:
            added, released, _, before = await sync_once(
                ledger, GRES, log, read=lambda held=held: held, before=before
            )
            out.append((added, released))
        return out

    # the first read is taken as it is (a restarted service); after it, a new holding
    # counts once two reads saw it, and what Slurm freed is given back at once
    assert asyncio.run(passes(two, {}, two, two, {})) == [(1, 0), (0, 2), (0, 0), (2, 0), (0, 2)]


def test_the_service_hosts_are_checked_against_slurms_nodes_and_gres(make_ledger):
    ledger = make_ledger()  # node-a: MIG A100 (3g.40gb, 2g.20gb, 2 x 1g.10gb) + 2 A100
    sinfo = {
        "nodes": [
            {
                "name": "node-a",
                "gres": "gpu:a100:2(S:0),gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2,shard:a100:16",
            },
            {"name": "login", "gres": ""},
        ]
    }
    assert configured_gres(sinfo)["node-a"]["shard"] == 16
    assert ledger.slurm_mismatches(configured_gres(sinfo), GRES) == []
    # gres.conf offers one 1g.10gb instance fewer, shards for one GPU only, and no node-a
    sinfo["nodes"][0]["gres"] = "gpu:a100:2,gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:1,shard:8"
    assert ledger.slurm_mismatches(configured_gres(sinfo), GRES) == [
        "node-a: gpu:1g.10gb is 2 here and 1 in Slurm's gres",
        "node-a: shard is 16 here and 8 in Slurm's gres",
    ]
    # untyped whole GPUs: only their number can be compared
    sinfo["nodes"][0]["gres"] = "gpu:h100:3,gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2"
    assert ledger.slurm_mismatches(configured_gres(sinfo), SlurmGres()) == [
        "node-a: 2 whole GPU(s) here, 3 in Slurm"
    ]
    nodes = {"login": Counter()}
    assert asyncio.run(check_nodes(ledger, GRES, read=lambda: nodes)) == [
        "node-a is not a Slurm node: nothing pinned to it can start"
    ]
