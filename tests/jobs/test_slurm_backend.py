"""The Slurm backend on a real single-node Slurm: a job preempted by a higher-priority
partition (PreemptMode=REQUEUE) checkpoints, is requeued by Slurm, and resumes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuslice_hub.errors import ConfigError
from gpuslice_hub.jobs.backends.slurm import (
    SlurmBackend,
    batch_script,
    check_class_options,
    exit_code,
)
from gpuslice_hub.profiles import parse_profiles
from tests.harness.hub import same_blas, wait_for
from tests.harness.slurm import PROFILES, slurm_hosts
from tests.jobs.notebooks import TRAIN_CELLS, loop_checkpoint_written, make_job_dir
from tests.jobs.test_jobs_hub import expected_w

HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'


def test_batch_script_has_requeue_signal_gres_and_append():
    script = batch_script(
        7,
        "/jobs/7",
        "/venv/bin/python",
        placement=["--gres=shard:2"],
        partition="preemptible",
        time_limit_minutes=90,
        env={"GPUSLICE_JOB_ID": "7"},
        qos="scavenger",
    )
    lines = script.splitlines()
    for expected in (
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --signal=B:USR1@60",
        "#SBATCH --gres=shard:2",
        "#SBATCH --partition=preemptible",
        "#SBATCH --qos=scavenger",
        "#SBATCH --time=90",
        # Slurm picks the device: a gpu job is told by Slurm, a shard job by its ordinal
        'export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}"',
        "export GPUSLICE_JOB_ID=7",
    ):
        assert expected in lines
    assert lines[-1] == "exec /venv/bin/python -m gpuslice.run /jobs/7"
    # a configured name is a token, never a second directive or shell code
    with pytest.raises(ValueError, match="qos"):
        batch_script(7, "/jobs/7", "/venv/bin/python", qos="normal\n#SBATCH --uid=0")


def test_a_class_account_reservation_and_constraint_are_sbatch_options_checked_at_start():
    script = batch_script(
        7,
        "/jobs/7",
        "/venv/bin/python",
        account="gpulab",
        reservation="deadline",
        constraint="a100&(ib|roce)",
    ).splitlines()
    for expected in (
        "#SBATCH --account=gpulab",
        "#SBATCH --reservation=deadline",
        "#SBATCH --constraint=a100&(ib|roce)",
    ):
        assert expected in script
    with pytest.raises(ValueError, match="constraint"):
        batch_script(7, "/jobs/7", "/venv/bin/python", constraint="a100\n#SBATCH --uid=0")
    classes = ["preemptible", "normal", "high"]
    check_class_options({"account": {"normal": "gpulab"}, "qos": {"high": ""}}, classes)
    with pytest.raises(ConfigError) as e:
        check_class_options({"reservation": {"urgent": "deadline"}}, classes)
    assert e.value.key == "JobManager.slurm_reservations" and "no priority class" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_class_options({"account": {"normal": "gpu lab"}}, classes)
    assert e.value.key == "JobManager.slurm_accounts"


MIG = parse_profiles(PROFILES)["mig-1g.10gb"]


def test_squeue_exit_codes_are_wait_statuses():
    # recorded from Slurm 22.05: `exit 3` -> 768; a batch shell killed by SIGKILL -> 9
    assert exit_code(768) == 3 and exit_code(0) == 0 and exit_code(75 << 8) == 75
    assert exit_code(9) is None  # a signal: no exit code to tell (not a success)
    assert exit_code(None) is None and exit_code("0") is None


def runner_state(d: Path) -> dict:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slurm
def test_preempted_by_a_higher_priority_partition_resumes_from_checkpoint(slurm, tmp_path):
    d = make_job_dir(tmp_path / "job", parameters={"steps": 400, "delay": 0.02}, interval=1.0)
    (d / "result.json").unlink(missing_ok=True)
    backend = SlurmBackend(sys.executable, partition="preemptible", env=slurm.env)
    # the profile's gres, on whichever node Slurm picks
    ref = backend.submit(1, str(d), {"GPUSLICE_JOB_ID": "1", **same_blas()}, MIG, 1, "preemptible")
    info = slurm.job_info(ref["slurm_job_id"])
    assert (info["TresPerNode"], info["ReqNodeList"]) == ("gres:gpu:1g.10gb:1", "(null)")
    slurm.wait_state(ref["slurm_job_id"], "RUNNING", timeout=60)
    assert backend.poll(ref).node == slurm.node.name
    wait_for(lambda: loop_checkpoint_written(d), 90, "the loop's first checkpoint")

    winner = slurm.sbatch(HOLD, "--partition=interactive", "--gres=gpu:1g.10gb:1")
    slurm.wait_state(winner, "RUNNING", timeout=60)
    info = slurm.job_info(ref["slurm_job_id"])
    assert info["JobState"] in {"PENDING", "REQUEUED"} and int(info["Restarts"]) == 1
    # the runner got Slurm's SIGTERM, checkpointed and exited 75 within KillWait
    st = wait_for(
        lambda: runner_state(d).get("status") == "preempted" and runner_state(d),
        30,
        "the runner to record its preemption",
    )
    assert st["lost_work_seconds"] < 2
    waiting = backend.poll(ref)  # still Slurm's job, waiting to run again
    assert waiting.alive and waiting.node == "" and waiting.waiting.startswith("pending in Slurm")

    (slurm.root / "jobs" / f"{winner}.release").touch()
    slurm.wait_state(winner, "COMPLETED", timeout=30)

    def runs_again() -> bool:
        # slurmctld holds a requeued job back (BeginTime); a poll lets it start when it fits
        status = backend.poll(ref)
        return bool(status.node) or not status.alive

    wait_for(runs_again, 60, "the requeued job to run again")
    slurm.wait_state(ref["slurm_job_id"], "COMPLETED", timeout=180)
    status = backend.poll(ref)
    assert not status.alive and status.exit_code == 0
    result = json.loads((d / "result.json").read_text())
    assert 0 < result["first_step"] < 400
    np.testing.assert_array_equal(result["w"], expected_w(400, 0.05))
    out = (d / "slurm.out").read_text()
    assert out.count("DUE TO PREEMPTION") == 1  # appended to, not overwritten, on restart
    log = (d / "job.log").read_text()
    # the log says truly where the cells resumed: after the last namespace snapshot, or
    # from the top when none was taken before the preemption (the loop itself resumes from
    # its own checkpoint either way: first_step above)
    assert "attempt 2" in log
    resumed = re.search(r"resumed from the namespace snapshot after cell (\d+)", log)
    if resumed:
        assert int(resumed.group(1)) > 0, log
    else:
        assert "no namespace snapshot was taken: running from the first cell" in log, log


@pytest.mark.slurm
@pytest.mark.hub
def test_service_job_through_slurm_is_requeued_by_slurm_and_resumes(slurm, hub_factory):
    from tests.jobs.test_jobs_hub import RESULT_CELL, output_result, submit, wait_state

    env = {k: v for k, v in slurm.env.items() if k.startswith("SLURM") or k == "PATH"}
    hub = hub_factory(
        # the ledger's host is the Slurm node: the ledger records the job where Slurm runs it
        hosts=slurm_hosts(slurm.node.name),
        profiles=PROFILES,
        extra_service_config=(
            f"import os\nos.environ.update({env!r})\n"
            "c.GPUSliceService.job_backend = 'slurm'\n"
            "c.JobManager.slurm_partitions = {'preemptible': 'preemptible'}\n"
        ),
    )
    alice = hub.add_user("alice")
    r = submit(
        hub,
        alice,
        cells=[*TRAIN_CELLS[:3], RESULT_CELL],
        profile="mig-1g.10gb",
        parameters={"steps": 400, "delay": 0.02},
        checkpoint_interval=1,
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    running = wait_state(hub, alice, job_id, "running", timeout=90)
    # Slurm was asked for the profile's gres (the spawner's translation), and the ledger
    # holds the slice on the node where Slurm runs the job
    (sid,) = [
        j for j in slurm.active_jobs() if slurm.job_info(j)["JobName"] == f"gpuslice-{job_id}"
    ]
    assert slurm.job_info(sid)["TresPerNode"] == "gres:gpu:1g.10gb:1"
    assert f"Slurm started it on {slurm.node.name}" in [t["reason"] for t in running["transitions"]]
    held = hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"]
    assert [(a["purpose"], a["host"], a["profile"]) for a in held] == [
        ("batch", slurm.node.name, "mig-1g.10gb")
    ]
    d = hub.workdir / "gpuslice-jobs" / str(job_id)
    wait_for(lambda: loop_checkpoint_written(d), 90, "the loop's first checkpoint")

    winner = slurm.sbatch(HOLD, "--partition=interactive", "--gres=gpu:1g.10gb:1")
    slurm.wait_state(winner, "RUNNING", timeout=60)

    def requeued():
        j = wait_state(hub, alice, job_id, ("queued", "starting", "running"), timeout=5)
        return "preempted" in [t["state"] for t in j["transitions"]] and j

    try:
        j = wait_for(requeued, 60, "the service to see Slurm's requeue")
    except TimeoutError:
        print(hub.log()[-8000:], slurm.log_tail())
        raise
    assert j["restarts"] == 0 and j["preemptions"] == 1
    (slurm.root / "jobs" / f"{winner}.release").touch()
    # not held back by slurmctld's post-requeue BeginTime (~2 minutes)
    done = wait_state(hub, alice, job_id, ("completed", "failed"), timeout=60)
    assert done["state"] == "completed", done
    result = output_result(hub, alice, job_id)
    assert 0 < result["first_step"] < 400
    np.testing.assert_array_equal(result["w"], expected_w(400, 0.05))
