"""Slurm's queue is the queue: the service's pass with the Slurm backend, on a ledger and job
table in SQLite, with Slurm's commands answered from a recorded queue (the fields squeue
22.05 prints; the real cluster runs in test_slurm_backend.py, test_slurm_nodes.py and
tests/spawner/test_slurm_spawner.py).

What is checked: a job goes to Slurm when it is seen, asking for its profile's gres and its
class's partition and QOS, with no node; it waits there with Slurm's reason and in Slurm's
priority order; the ledger records it on the node where Slurm runs it and releases it when
Slurm requeues or ends it; an interactive spawn takes a preemptible job's slice at once and
leaves the preemption to Slurm (the service steps in only when Slurm does not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import Pending
from gpuslice_hub.jobs.backends.slurm import (
    RECORD_FIELDS,
    SlurmBackend,
    parse_records,
    profile_sbatch_options,
)
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.profiles import parse_profiles
from gpuslice_hub.slurmsync import sync_once
from gpuslice_hub.slurmusage import held_by_jobs
from gpuslice_spawner.launchers.slurm import SlurmGres
from tests.jobs.full_cluster import insert_queued
from tests.service.conftest import build_ledger

A100 = "NVIDIA A100-SXM4-80GB"
PROFILES: list[dict] = [
    {"name": "gpu-1", "kind": "gpu", "count": 1},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
]
HOSTS = [
    {
        "name": name,
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [{"model": A100, "memory_mib": 81920, "count": 1}],
    }
    for name in ("n1", "n2")
]


class RecordedSlurm(SlurmBackend):
    """The real backend (scripts, squeue parsing, states) with Slurm's commands answered
    from a queue the test sets, in squeue --json's shape."""

    def __init__(self) -> None:
        super().__init__(
            sys.executable,
            gres=SlurmGres(gpu_types={A100: "a100"}),
            partitions={"preemptible": "scavenge", "normal": "", "high": ""},
            qos={"high": "urgent"},
            submit_prefix=["runuser", "-u", "{username}", "--"],
        )
        self.queue: dict[str, dict[str, Any]] = {}
        self.sbatch_fails: Exception | None = None  # the next sbatch raises this
        self.scancel_fails: Exception | None = None  # the next scancel raises this
        self.commands: list[tuple[str, ...]] = []
        self.scripts: dict[str, str] = {}

    def set(self, sid: str, state: str, **fields: Any) -> None:
        self.queue[sid].update(job_state=state, **fields)

    def _run(self, *argv: str, stdin: str | None = None, ref: dict[str, Any] | None = None) -> str:
        self.commands.append(argv)
        if argv[0] == "sbatch":
            if self.sbatch_fails is not None:
                error, self.sbatch_fails = self.sbatch_fails, None
                raise error
            sid = str(100 + len(self.scripts))
            self.scripts[sid] = stdin or ""
            name = next(line for line in (stdin or "").splitlines() if "--job-name=" in line)
            self.queue[sid] = {
                "job_id": int(sid),
                "job_state": "PENDING",
                "state_reason": "Priority",
                "priority": 1000,
                "nodes": "",
                "exit_code": 0,
                "restart_cnt": 0,
                "name": name.split("=", 1)[1],
            }
            return f"{sid}\n"
        if argv[0] == "squeue":
            ids = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")]
            names = [a.split("=", 1)[1] for a in argv if a.startswith("--name=")]
            if ids and len(ids[0]) == 1 and ids[0][0] not in self.queue:
                # what squeue 22.05 says of one id slurmctld has forgotten
                raise RuntimeError("squeue failed: slurm_load_jobs error: Invalid job id specified")
            shown = [
                i
                for i in (ids[0] if ids else list(self.queue))
                if i in self.queue and (not names or self.queue[i]["name"] in names)
            ]
            if names:
                return "".join(f"{i}|\n" for i in shown)
            return "".join(
                "".join(f"{self.queue[i].get(key, '')}|" for _, key in RECORD_FIELDS) + "\n"
                for i in shown
            )
        if argv[0] == "scancel" and self.scancel_fails is not None:
            error, self.scancel_fails = self.scancel_fails, None
            raise error
        if argv[0] == "scancel" and "--signal=TERM" not in argv:
            self.queue[argv[-1]]["job_state"] = "CANCELLED"
        return ""


def setup(tmp_path: Path) -> tuple[Ledger, JobManager, Scheduler, RecordedSlurm]:
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=HOSTS)
    slurm = RecordedSlurm()
    jobs = JobManager(ledger, ledger.db, slurm, tmp_path / "jobs")
    jobs.log.setLevel(logging.WARNING)
    jobs.run_jobs_as_service_user = True
    ledger.preempt_hook = jobs.preempt_for_interactive
    return ledger, jobs, Scheduler(jobs), slurm


def add_jobs(jobs: JobManager, *specs: tuple[str, str]) -> list[int]:
    """Queued jobs of alice's of (profile, priority class), as submit() leaves them."""
    return insert_queued(jobs.db, jobs.root, [("alice", *spec) for spec in specs], "slurm")


def row(jobs: JobManager, job_id: int) -> JobRow:
    found = jobs.row(job_id)
    assert found is not None
    return found


def batch_slices(ledger: Ledger) -> list[tuple[str, str]]:
    return sorted(
        (a["server_name"], a["host"]) for a in ledger.allocations() if a["purpose"] == "batch"
    )


def sid(jobs: JobManager, job_id: int) -> str:
    return str(row(jobs, job_id).backend_ref["slurm_job_id"])


def test_a_profile_asks_slurm_for_its_gres_on_no_particular_node():
    profiles = parse_profiles(
        [
            {"name": "mig", "kind": "mig", "mig_profile": "1g.10gb"},
            {"name": "share", "kind": "share", "gpu_milli": 250},
            {"name": "two", "kind": "gpu", "count": 2, "models": [A100]},
            {"name": "any", "kind": "gpu", "count": 1},
        ]
    )
    gres = SlurmGres(gpu_types={A100: "a100"}, shards_per_gpu=8)
    assert profile_sbatch_options(profiles["mig"], 3, gres) == ["--gres=gpu:1g.10gb:3"]
    assert profile_sbatch_options(profiles["share"], 1, gres) == ["--gres=shard:2"]
    assert profile_sbatch_options(profiles["two"], 1, gres) == ["--gres=gpu:a100:2"]
    # a profile open to every model: the cluster's one whole-GPU type (an untyped "gpu"
    # may be given MIG instances), and Slurm picks among several only when there are
    assert profile_sbatch_options(profiles["any"], 2, gres) == ["--gres=gpu:a100:2"]
    two = SlurmGres(gpu_types={A100: "a100", "NVIDIA L4": "l4"})
    assert profile_sbatch_options(profiles["any"], 2, two) == ["--gres=gpu:2"]


def test_jobs_go_to_slurm_at_once_and_wait_there_in_its_order_with_its_reason(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    a, b, c = add_jobs(jobs, ("gpu-1", "preemptible"), ("share-250", "high"), ("gpu-1", "normal"))
    scheduler.tick()
    assert [cmd[0] for cmd in slurm.commands] == ["sbatch"] * 3  # one query: none yet
    # each as its owner, with its profile's gres, its class's partition and QOS, no node
    script_a, script_b = slurm.scripts[sid(jobs, a)], slurm.scripts[sid(jobs, b)]
    assert "#SBATCH --gres=gpu:a100:1" in script_a and "#SBATCH --partition=scavenge" in script_a
    assert "#SBATCH --gres=shard:2" in script_b and "#SBATCH --qos=urgent" in script_b
    assert "--nodelist" not in script_a + script_b
    assert row(jobs, a).waiting_reason == f"submitted to Slurm as job {sid(jobs, a)}"
    assert batch_slices(ledger) == []  # nothing is held while Slurm has not started it

    # Slurm's priorities order the queue shown in the panel
    for job_id, priority in ((a, 10), (b, 30), (c, 20)):
        slurm.set(sid(jobs, job_id), "PENDING", priority=priority, state_reason="Resources")
    scheduler.tick()
    assert row(jobs, a).waiting_reason == "pending in Slurm (Resources)"
    page, _, _ = jobs.list_jobs(None, None, 10, order="run")
    assert [(j["id"], j["queue_position"]) for j in page] == [(b, 1), (c, 2), (a, 3)]
    assert len([cmd for cmd in slurm.commands if "sbatch" in cmd]) == 3  # never again


def test_the_ledger_holds_a_job_where_slurm_runs_it_until_slurm_ends_it(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n2")
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "starting" and job.transitions[-1].reason == "Slurm started it on n2"
    assert batch_slices(ledger) == [(f"job-{a}", "n2")]
    assert ledger.profile_capacity()["gpu-1"][0] == 1  # n1's GPU only

    slurm.set(sid(jobs, a), "COMPLETED", exit_code=0)
    scheduler.tick()
    assert row(jobs, a).state == "completed" and batch_slices(ledger) == []


def test_a_job_slurm_runs_on_a_node_it_takes_no_new_work_on_is_recorded_there(tmp_path):
    # n2 is in a reservation the job was sent into (or drained after Slurm started it):
    # offered to nobody, but what Slurm runs there is recorded there, not taken for foreign
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    ledger.mirror_engine_out({"n2": "in Slurm's reservation gpuslice-batch"})
    assert ledger.profile_capacity()["gpu-1"] == (1, 1)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n2")
    scheduler.tick()
    job = row(jobs, a)
    assert job.transitions[-1].reason == "Slurm started it on n2"
    assert batch_slices(ledger) == [(f"job-{a}", "n2")]
    assert job.backend_ref["unrecorded"] is False


def test_a_job_slurm_requeues_gives_its_slice_back_and_runs_again_where_slurm_says(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    scheduler.tick()
    Path(row(jobs, a).job_dir).mkdir(parents=True)
    (Path(row(jobs, a).job_dir) / "state.json").write_text(
        json.dumps({"status": "preempted", "lost_work_seconds": 3.0})
    )
    # preempted by Slurm for other work: back in its queue, held back (BeginTime) for the
    # 121 s slurmctld 22.05 holds a requeued job (its submit time is the requeue's)
    slurm.set(
        sid(jobs, a),
        "PENDING",
        nodes="",
        state_reason="BeginTime",
        restart_cnt=1,
        submit_time="2026-12-07T13:52:50",
        eligible_time="2026-12-07T13:54:51",
    )
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "queued" and job.preemptions == 1
    # the runner's figure, never more than the attempt ran
    assert 0 < job.lost_work_seconds < 3.0
    assert batch_slices(ledger) == []
    # the service lets it start as soon as it fits, not minutes later (but not in the
    # requeue's own second: slurmd would refuse its launch credential)
    release = ("scontrol", "update", f"jobid={sid(jobs, a)}", "StartTime=2026-12-07T13:52:52")
    assert release in slurm.commands
    # a run Slurm is still tearing down is not taken for a new one
    slurm.set(sid(jobs, a), "COMPLETING", nodes="n1", restart_cnt=1)
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1", restart_cnt=0)  # as read before the requeue
    scheduler.tick()
    assert row(jobs, a).state == "queued" and batch_slices(ledger) == []
    slurm.set(sid(jobs, a), "RUNNING", nodes="n2", restart_cnt=1)
    scheduler.tick()
    assert row(jobs, a).state == "starting" and batch_slices(ledger) == [(f"job-{a}", "n2")]
    assert len(slurm.scripts) == 1  # the same Slurm job ran again: no second submission


def full_with_a_preemptible_job(
    tmp_path: Path,
) -> tuple[Ledger, JobManager, Scheduler, RecordedSlurm, int, str]:
    """Both GPUs held: carol's server on one, a preemptible job Slurm runs on the other
    (its id and node are returned last)."""
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    ledger.allocate(Caller("carol", (), "carol"), "gpu-1", "")  # n1 or n2 taken
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    scheduler.tick()
    free = [h["name"] for h in HOSTS if ("", h["name"]) not in _servers(ledger)]
    slurm.set(sid(jobs, a), "RUNNING", nodes=free[0])
    scheduler.tick()
    assert ledger.profile_capacity()["gpu-1"][0] == 0
    return ledger, jobs, scheduler, slurm, a, free[0]


def test_an_interactive_spawn_takes_the_slice_and_slurm_preempts_the_job(tmp_path):
    ledger, jobs, scheduler, slurm, a, node = full_with_a_preemptible_job(tmp_path)

    bob = Caller("bob", (), "bob")
    with pytest.raises(Pending, match="Slurm preempts it for your server"):
        ledger.allocate(bob, "gpu-1", "", wait_seconds=5)
    job = row(jobs, a)
    assert job.state == "preempting" and job.allocation_ids == [] and job.preemptions == 1
    # the service neither signals nor kills it: Slurm does, for the server's job
    assert not [cmd for cmd in slurm.commands if "scancel" in cmd]
    grant, _ = ledger.allocate(bob, "gpu-1", "", wait_seconds=5)
    assert grant["host"] == node

    # Slurm did not preempt it in time (say the partitions do not preempt each other): the
    # service asks the job to checkpoint and stop
    scheduler.tick(utcnow() + timedelta(seconds=jobs.preempt_grace + 1))
    assert [cmd for cmd in slurm.commands if "scancel" in cmd] == [
        ("scancel", "--batch", "--signal=TERM", sid(jobs, a))
    ]
    slurm.set(sid(jobs, a), "FAILED", exit_code=75 << 8)
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "queued" and "preempted" in [t.state for t in job.transitions]
    scheduler.tick()  # its Slurm job ended: it is handed to Slurm again
    assert len(slurm.scripts) == 2
    assert (row(jobs, a).waiting_reason or "").startswith("submitted")
    ledger.release(grant["id"], "bob", "server stopped")
    slurm.set(sid(jobs, a), "RUNNING", nodes=node)
    scheduler.tick()
    assert row(jobs, a).allocation_ids  # recorded again
    assert "preempted_by" not in row(jobs, a).backend_ref  # a later preemption is the service's


def _servers(ledger: Ledger) -> set[tuple[str, str]]:
    return {
        (a["server_name"], a["host"]) for a in ledger.allocations() if a["purpose"] == "interactive"
    }


def test_cancelling_a_job_waiting_in_slurm_cancels_its_slurm_job(tmp_path):
    _, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    jobs.cancel(a, "alice")
    assert slurm.queue[sid(jobs, a)]["job_state"] == "CANCELLED"
    assert row(jobs, a).state == "cancelled"


def test_a_cancel_slurm_does_not_answer_frees_the_slice_and_is_tried_again(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n2")
    scheduler.tick()
    assert batch_slices(ledger) == [(f"job-{a}", "n2")]
    slurm.scancel_fails = RuntimeError("scancel failed: Unable to contact slurm controller")
    # the cancel stands; the slice goes back at once (the mirror of Slurm's holdings holds
    # the GPU of a finished job's run that still runs: jobs_accounted leaves it out)
    assert jobs.cancel(a, "alice")["state"] == "cancelled"
    assert batch_slices(ledger) == []
    assert sid(jobs, a) not in jobs.jobs_accounted()
    assert slurm.queue[sid(jobs, a)]["job_state"] == "RUNNING"
    # the next pass cancels it in Slurm
    scheduler.tick()
    assert slurm.queue[sid(jobs, a)]["job_state"] == "CANCELLED"
    assert jobs.kills_pending == {}


def test_a_spawn_whose_chosen_job_slurm_ran_ends_first_is_asked_to_try_again(tmp_path):
    """Found by an attack: the spawn was refused "No gpu-1 free" while the job it had picked
    had just been cancelled and its slice given back."""
    ledger, jobs, _, _, _, node = full_with_a_preemptible_job(tmp_path)
    picked = jobs._victim_for

    def picked_then_cancelled(*args: Any, **kwargs: Any) -> Any:
        victim = picked(*args, **kwargs)
        if victim is not None:
            jobs.cancel(victim.id, victim.user)  # by its owner, between the pick and the ask
        return victim

    jobs._victim_for = picked_then_cancelled  # type: ignore[method-assign]
    bob = Caller("bob", (), "bob")
    with pytest.raises(Pending) as pending:
        ledger.allocate(bob, "gpu-1", "", wait_seconds=5)
    assert "asking for it again" in pending.value.message
    assert ledger.allocate(bob, "gpu-1", "", wait_seconds=5)[0]["host"] == node


def test_a_spawn_that_needs_a_job_an_admin_preempts_already_waits_for_its_checkpoint(tmp_path):
    """Found by a review: it was told the job "has just given a slice up", though the job
    still held it, checkpointing."""
    ledger, jobs, _, _, a, _ = full_with_a_preemptible_job(tmp_path)
    jobs.preempt(a, "admin", "maintenance")
    assert row(jobs, a).state == "preempting" and row(jobs, a).allocation_ids
    with pytest.raises(Pending) as pending:
        ledger.allocate(Caller("bob", (), "bob"), "gpu-1", "", wait_seconds=600)
    assert pending.value.message == (
        f"Preempting batch job {a} to free a slice; your server will start when it has checkpointed"
    )


def test_a_job_slurm_runs_where_the_ledger_has_no_room_is_shown_running_and_said(tmp_path, caplog):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    for user in ("u1", "u2"):
        ledger.allocate(Caller(user, (), user), "gpu-1", "")
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    with caplog.at_level(logging.WARNING):
        scheduler.tick()
        scheduler.tick()
    job = row(jobs, a)
    assert job.state == "starting" and job.allocation_ids == []
    # its history says so, and the log, once for this run
    assert "the ledger could not record it (no free gpu-1 on n1" in job.transitions[-1].reason
    said = [r.getMessage() for r in caplog.records if "cannot record" in r.getMessage()]
    assert len(said) == 1 and "no free gpu-1 on n1 in the ledger" in said[0], said


def test_squeues_records_are_read_field_by_field_and_a_strange_line_is_an_error():
    # recorded from Slurm 22.05 (squeue --noheader --Format=JobID:|,State:|,...), with the
    # Partition field the pass reads since burst (last)
    # and the eligible and submit times since issue 46 (last)
    out = (
        "302|FAILED|vm|NonZeroExitCode|4294901458|0|768|batch|"
        "2026-12-07T13:52:40|2026-12-07T13:52:40|\n"
        "2|PENDING||Resources|4294901758|0|0|cloud|2026-12-07T13:52:50|2026-12-07T13:52:50|\n"
        "1|RUNNING|vm|None|4294901759|1|0|batch|2026-12-07T13:54:51|2026-12-07T13:52:50|\n"
    )
    records = parse_records(out)
    assert records["302"]["exit_code"] == 768 and records["302"]["nodes"] == "vm"
    assert records["2"] == {
        "job_id": 2,
        "job_state": "PENDING",
        "nodes": "",
        "state_reason": "Resources",
        "priority": 4294901758,
        "restart_cnt": 0,
        "exit_code": 0,
        "partition": "cloud",
        "eligible_time": "2026-12-07T13:52:50",
        "submit_time": "2026-12-07T13:52:50",
    }
    assert records["1"]["restart_cnt"] == 1
    with pytest.raises(RuntimeError, match="unexpected line"):
        parse_records("2|PENDING|\n")


def state_json(jobs: JobManager, job_id: int, **state: Any) -> None:
    """The runner's state.json for the job's current submission."""
    job = row(jobs, job_id)
    folder = Path(job.job_dir)
    folder.mkdir(parents=True, exist_ok=True)
    attempt = job.backend_ref.get("attempt_id")
    (folder / "state.json").write_text(json.dumps({"attempt_id": attempt, **state}))


def test_a_slurm_job_that_ended_between_passes_is_accounted_once_never_run_again(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    a, b, c = add_jobs(jobs, ("gpu-1", "normal"), ("gpu-1", "normal"), ("gpu-1", "normal"))
    scheduler.tick()
    # a ran and completed while the service was down
    state_json(jobs, a, status="completed", cells_done=3, cells_total=3)
    slurm.set(sid(jobs, a), "COMPLETED", nodes="n1", exit_code=0)
    # an admin cancelled b in Slurm before it ran
    slurm.set(sid(jobs, b), "CANCELLED", exit_code=0)
    # c's node failed before its runner started: no word from it
    slurm.set(sid(jobs, c), "NODE_FAIL", exit_code=0)
    scheduler.tick()
    assert row(jobs, a).state == "completed" and row(jobs, a).cells_done == 3
    assert row(jobs, b).state == "cancelled"
    assert "cancelled in Slurm" in row(jobs, b).transitions[-1].reason
    job_c = row(jobs, c)
    assert job_c.state == "queued" and job_c.not_before is not None  # a crash: backoff
    assert "ended (NODE_FAIL)" in " ".join(t.reason for t in job_c.transitions)
    scheduler.tick()
    assert len(slurm.scripts) == 3  # nothing submitted again yet
    scheduler.tick(utcnow() + timedelta(seconds=jobs.restart_backoff + 1))
    assert len(slurm.scripts) == 4 and sid(jobs, c) == "103"  # c, once its backoff ended
    assert batch_slices(ledger) == []


def test_one_forgotten_slurm_job_does_not_stop_the_pass(tmp_path):
    _, jobs, scheduler, slurm = setup(tmp_path)
    a, b = add_jobs(jobs, ("gpu-1", "normal"), ("gpu-1", "normal"))
    scheduler.tick()
    del slurm.queue[sid(jobs, a)]  # past MinJobAge while the service was down
    slurm.set(sid(jobs, b), "RUNNING", nodes="n2")
    jobs.cancel(b, "alice")  # only a is left to ask about: squeue is given one id
    scheduler.tick()
    # accounted for, not stuck: no word from its runner, so a crash, submitted again later
    job = row(jobs, a)
    assert job.state == "queued" and job.not_before is not None and job.backend_ref["ended"]
    assert any("--jobs=" not in " ".join(cmd) for cmd in slurm.commands if cmd[0] == "squeue")


def test_slurms_own_requeues_are_no_runner_crashes(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    scheduler.tick()
    for restart in range(jobs.max_restarts + 2):
        slurm.set(sid(jobs, a), "RUNNING", nodes="n1", restart_cnt=restart)
        scheduler.tick()
        assert row(jobs, a).state == "starting"
        # a node failure: Slurm requeues the job without the runner saying a word
        slurm.set(sid(jobs, a), "PENDING", nodes="", state_reason="Resources")
        scheduler.tick()
    job = row(jobs, a)
    assert job.state == "queued" and job.preemptions == jobs.max_restarts + 2
    assert "Slurm requeued it" in " ".join(t.reason for t in job.transitions)
    assert len(slurm.scripts) == 1 and batch_slices(ledger) == []


def test_a_refused_submission_is_tried_again_or_failed_by_what_slurm_said(tmp_path):
    import subprocess

    _, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    limit = "sbatch failed: Batch job submission failed: Job violates accounting/QOS policy"
    slurm.sbatch_fails = RuntimeError(limit)
    now = utcnow()
    scheduler.tick(now)
    job = row(jobs, a)
    assert job.state == "queued" and job.not_before is not None
    assert job.waiting_reason == f"Slurm refused the submission: {limit}; trying again in 5 s"
    scheduler.tick(now + timedelta(seconds=1))
    assert slurm.scripts == {}  # not before its backoff ends

    # sbatch timed out, yet Slurm queued it: the next try finds it instead of a second one
    slurm.sbatch_fails = subprocess.TimeoutExpired("sbatch", 30)
    scheduler.tick(now + timedelta(seconds=6))
    assert row(jobs, a).backend_ref.get("unsure")
    assert "trying again in 10 s" in (row(jobs, a).waiting_reason or "")
    slurm.queue["999"] = {
        "job_id": 999,
        "job_state": "PENDING",
        "state_reason": "Priority",
        "priority": 1,
        "nodes": "",
        "exit_code": 0,
        "restart_cnt": 0,
        "name": f"gpuslice-{a}",
    }
    scheduler.tick(now + timedelta(seconds=17))
    assert sid(jobs, a) == "999" and slurm.scripts == {}

    (b,) = add_jobs(jobs, ("gpu-1", "normal"))
    slurm.sbatch_fails = RuntimeError(
        "sbatch failed: Batch job submission failed: Requested node configuration is not available"
    )
    scheduler.tick(now + timedelta(seconds=18))
    assert row(jobs, b).state == "failed"
    assert "Requested node configuration is not available" in (row(jobs, b).error or "")


def test_a_job_running_when_the_service_was_upgraded_is_adopted_not_requeued(tmp_path):
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    scheduler.tick()
    with jobs.db.writing() as s:  # as an earlier version left it: no run number
        job = s.get(JobRow, a)
        job.backend_ref = {k: v for k, v in job.backend_ref.items() if k != "run"}
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "starting" and job.restarts == 0 and job.backend_ref["run"] == 0
    assert batch_slices(ledger) == [(f"job-{a}", "n1")]


def test_profiles_whose_models_slurm_cannot_ask_for_are_said_at_start():
    from gpuslice_hub.jobs.setup import slurm_model_gaps

    profiles = parse_profiles(
        [
            {"name": "a100", "kind": "gpu", "count": 1, "models": [A100]},
            {"name": "either", "kind": "gpu", "count": 1, "models": [A100, "NVIDIA L4"]},
            {"name": "quarter", "kind": "share", "gpu_milli": 250, "models": [A100]},
            {"name": "any", "kind": "gpu", "count": 1},
        ]
    )
    gaps = slurm_model_gaps(profiles, SlurmGres(gpu_types={A100: "a100"}))
    assert [g.split(":")[0] for g in gaps] == ["profile either", "profile quarter"]
    assert "Slurm may run them on other GPUs" in gaps[0]
    # a whole GPU of any model asks for the one type; with two, nothing says which
    two = SlurmGres(gpu_types={A100: "a100", "NVIDIA L4": "l4"})
    gaps = slurm_model_gaps(profiles, two)
    assert [g.split(":")[0] for g in gaps] == ["profile either", "profile quarter", "profile any"]
    assert "may satisfy with a MIG instance's gres" in gaps[-1]


def test_a_requeued_job_cancelled_in_slurm_is_cancelled_not_taken_for_completed(tmp_path):
    _, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    scheduler.tick()
    state_json(jobs, a, status="preempted", lost_work_seconds=1.0)
    slurm.set(sid(jobs, a), "PENDING", nodes="", restart_cnt=1, state_reason="Resources")
    scheduler.tick()
    assert row(jobs, a).state == "queued"
    # an admin scancels it while it waits; Slurm reports exit code 0 for that
    slurm.set(sid(jobs, a), "CANCELLED", exit_code=0)
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "cancelled" and "cancelled in Slurm" in job.transitions[-1].reason
    assert len(slurm.scripts) == 1
    assert job.waiting_reason is None  # (it said "Resources" while it waited)


def test_a_running_job_scancelled_in_slurm_is_cancelled_not_resubmitted(tmp_path):
    _, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    scheduler.tick()
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    scheduler.tick()
    assert row(jobs, a).state in ("starting", "running")  # (placed, whether or not it said so)
    # scancel sends the batch script SIGTERM: the runner takes it for a preemption and
    # exits 75; Slurm then says CANCELLED, with that exit code (as a real slurmctld does)
    state_json(jobs, a, status="preempted", lost_work_seconds=0.1)
    slurm.set(sid(jobs, a), "CANCELLED", nodes="", exit_code=75)
    for _ in range(3):
        scheduler.tick()
    job = row(jobs, a)
    assert job.state == "cancelled", [(t.state, t.reason) for t in job.transitions]
    assert job.transitions[-1].reason == "cancelled in Slurm, outside gpuslice"
    assert job.preemptions == 0 and job.restarts == 0
    assert len(slurm.scripts) == 1  # not handed to Slurm again
    assert job.allocation_ids == []


def test_sbatch_that_cannot_be_run_is_said_and_tried_again_not_a_traceback_per_pass(tmp_path):
    _, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    slurm.sbatch_fails = FileNotFoundError(2, "No such file or directory", "sbatch")
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "queued" and job.not_before is not None
    assert "Slurm refused the submission: sbatch could not be run" in str(job.waiting_reason)


class ServiceKilled(BaseException):
    """The service dies here: no ``except Exception`` of its own runs."""


def test_a_submission_the_service_died_during_is_found_not_made_twice(tmp_path):
    """Found by a crash attack on a real Slurm: killed while its sbatch ran (which went on
    and queued the job), the service knew nothing of that Slurm job, submitted the job
    again, and the first ran untracked, on through the job's cancel."""
    _ledger, jobs, scheduler, slurm = setup(tmp_path)
    a, b = add_jobs(jobs, ("gpu-1", "normal"), ("gpu-1", "normal"))
    real_run = slurm._run

    def sbatch_then_die(*argv: str, **kw: Any) -> str:
        out = real_run(*argv, **kw)
        if argv[0] == "sbatch":
            raise ServiceKilled  # Slurm has it; the service never hears the id
        return out

    slurm._run = sbatch_then_die  # type: ignore[method-assign]
    with pytest.raises(ServiceKilled):
        scheduler.tick()
    (first,) = slurm.scripts
    assert row(jobs, a).backend_ref.get("unsure")

    # the restarted service looks for it before submitting anything
    slurm._run = real_run  # type: ignore[method-assign]
    restarted = Scheduler(jobs)
    restarted.tick()
    assert sid(jobs, a) == first
    assert not row(jobs, a).backend_ref.get("unsure")
    assert [s for s in slurm.scripts if s != first] == [sid(jobs, b)]  # b's, once

    # cancelled while its submission's answer is unknown: the Slurm job found goes too
    (c,) = add_jobs(jobs, ("gpu-1", "normal"))
    slurm._run = sbatch_then_die  # type: ignore[method-assign]
    with pytest.raises(ServiceKilled):
        Scheduler(jobs).tick()
    slurm._run = real_run  # type: ignore[method-assign]
    (third,) = [s for s in slurm.scripts if s not in (first, sid(jobs, b))]
    jobs.cancel(c, "alice")
    assert slurm.queue[third]["job_state"] == "CANCELLED"


def test_a_job_slurm_runs_before_its_sbatch_answers_is_never_taken_for_a_foreign_one(tmp_path):
    """The race of issue 46: Slurm ran the job while its sbatch had not answered yet (a
    busy slurmctld), the mirror of Slurm's holdings read it twice as a job outside
    gpuslice and held its GPU, and the job pass then could not record it: its GPU was
    counted as Slurm's, not its owner's, for the whole run."""
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    log = logging.getLogger("test-mirror")
    passes: list[dict] = []

    def squeue_json() -> dict[str, Any]:
        return {
            "jobs": [
                {
                    "job_id": int(i),
                    "job_state": q["job_state"],
                    "nodes": q["nodes"],
                    "gres_detail": ["gpu:a100:1(IDX:0)"] if q["nodes"] else [],
                    "name": q["name"],
                    "user_name": "root",  # submitted as the service's account here
                }
                for i, q in slurm.queue.items()
            ]
        }

    def mirror_pass() -> None:
        # the service's Slurm loop, as app.py wires it: names of jobs being submitted,
        # then the ids of the others, then squeue
        submitting, ids = jobs.slurm_jobs_submitting(), jobs.jobs_accounted()
        before = passes[-1] if passes else None
        read = lambda: held_by_jobs(squeue_json(), ids, submitting)  # noqa: E731
        *_, now = asyncio.run(sync_once(ledger, slurm.gres, log, read, before, True))
        passes.append(now)

    sbatch = slurm._run

    def slow_sbatch(*argv: str, stdin: str | None = None, ref: Any = None) -> str:
        out = sbatch(*argv, stdin=stdin, ref=ref)
        if argv[0] == "sbatch":  # Slurm runs it at once; sbatch answers two passes later
            slurm.set(out.strip(), "RUNNING", nodes="n1")
            mirror_pass()
            mirror_pass()
        return out

    slurm._run = slow_sbatch  # type: ignore[method-assign]
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    assert [x for x in ledger.allocations() if x["purpose"] == "external"] == []
    scheduler.tick()
    job = row(jobs, a)
    assert job.transitions[-1].reason == "Slurm started it on n1"
    assert batch_slices(ledger) == [(f"job-{a}", "n1")] and not job.backend_ref["unrecorded"]
    mirror_pass()
    assert [x for x in ledger.allocations() if x["purpose"] == "external"] == []
    # ... while another user's job of that name is foreign all the same
    assert held_by_jobs(
        {"jobs": [{**squeue_json()["jobs"][0], "job_id": 999, "user_name": "mallory"}]},
        (),
        {(f"gpuslice-{a}", "root")},
    ) == {"n1": Counter({"gpu:a100": 1})}


def test_a_slurm_preemption_names_the_checkpoint_even_when_the_next_run_started_first(tmp_path):
    """Slurm requeued the job, its runner checkpointed and exited, and Slurm ran it again
    before the pass looked: the new run's state said "running". The history said "stopped
    without a checkpoint; 0s of work to redo"; it says which checkpoint the run took."""
    ledger, jobs, scheduler, slurm = setup(tmp_path)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    t0 = utcnow()
    scheduler.tick(t0)
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1")
    scheduler.tick(t0)
    state_json(jobs, a, status="running", attempt=1)
    scheduler.tick(t0 + timedelta(seconds=30))
    saved = t0.timestamp() + 50
    # 60 s in: preempted at 52 s (checkpoint at 50 s), and already running again
    state_json(
        jobs,
        a,
        status="running",
        attempt=2,
        preempted_attempt=1,
        lost_work_seconds=2.0,
        last_checkpoint_at=saved,
    )
    slurm.set(sid(jobs, a), "RUNNING", nodes="n1", restart_cnt=1)
    scheduler.tick(t0 + timedelta(seconds=60))
    job = row(jobs, a)
    said = {t.state: t.reason for t in job.transitions}
    when = datetime.fromtimestamp(saved, tz=UTC).strftime("%H:%M:%S UTC")
    assert said["preempting"] == (
        "Slurm requeued it (a preemption or a node failure); its runner checkpointed "
        f"(last checkpoint at {when}) and exited"
    )
    assert said["preempted"] == "checkpointed and exited; 2s of work to redo"
    assert job.preemptions == 1 and job.lost_work_seconds == 2.0
    # the new run is recorded as it runs
    scheduler.tick(t0 + timedelta(seconds=61))
    assert row(jobs, a).state == "starting" and batch_slices(ledger) == [(f"job-{a}", "n1")]
