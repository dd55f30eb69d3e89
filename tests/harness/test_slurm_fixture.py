"""The Slurm harness runs real jobs with (fake) GPU gres, and preempts by partition."""

from __future__ import annotations

import time

import pytest

from tests.harness.slurm import SlurmCluster, parse_scontrol_line

pytestmark = pytest.mark.slurm


def test_parse_scontrol_line_keeps_values_with_equals_and_spaces():
    line = (
        "JobId=7 JobName=wrap TRES=cpu=1,mem=256M,node=1 Command=/bin/echo a b "
        "GRES=gpu:1g.10gb:1(IDX:1) TresPerNode=gres:gpu:1g.10gb:1"
    )
    parsed = parse_scontrol_line(line)
    assert parsed["TRES"] == "cpu=1,mem=256M,node=1"
    assert parsed["Command"] == "/bin/echo a b"
    assert parsed["GRES"] == "gpu:1g.10gb:1(IDX:1)"
    assert parsed["TresPerNode"] == "gres:gpu:1g.10gb:1"


def test_node_declares_the_fake_gpus(slurm: SlurmCluster):
    node = parse_scontrol_line(
        slurm.run("scontrol", "show", "node", "-o", slurm.node.name).stdout.strip()
    )
    assert node["CPUTot"] == str(slurm.node.cpus)
    assert "gpu:1g.10gb:1" in node["Gres"]
    assert "gpu:a100:2" in node["Gres"]
    assert "shard:a100:8" in node["Gres"]
    assert set(slurm.partitions) == {"interactive", "preemptible"}


# A job that holds its allocation until the test creates "<jobid>.release" in the job dir:
# the test decides when it ends, instead of guessing with a sleep.
HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done\n'


def release(slurm: SlurmCluster, job: str) -> None:
    (slurm.root / "jobs" / f"{job}.release").touch()


def test_mig_like_gres_job_runs_and_sees_its_device(slurm: SlurmCluster):
    job = slurm.sbatch(
        'echo "CVD=$CUDA_VISIBLE_DEVICES JOB_GPUS=$SLURM_JOB_GPUS"\n' + HOLD,
        "--gres=gpu:1g.10gb:1",
    )
    # the per-device detail (IDX) is only shown while the job holds the device
    info = slurm.wait_state(job, "RUNNING")
    assert info["TresPerNode"] == "gres:gpu:1g.10gb:1"
    assert info["GRES"].startswith("gpu:1g.10gb:1(IDX:"), info
    assert info["NodeList"] == slurm.node.name
    idx = info["GRES"].split("IDX:")[1].rstrip(")")
    release(slurm, job)
    slurm.wait_state(job, "COMPLETED")
    out = slurm.output_path(job).read_text()
    assert f"CVD={idx} " in out
    assert f"JOB_GPUS={idx}" in out


def test_only_one_mig_device_means_two_jobs_do_not_overlap(slurm: SlurmCluster):
    # each job records when it held the device; the second must start after the first ends
    script = 'date +%s.%N > "$SLURM_JOB_ID.start"\n' + HOLD + 'date +%s.%N > "$SLURM_JOB_ID.end"'
    first = slurm.sbatch(script, "--gres=gpu:1g.10gb:1")
    second = slurm.sbatch(script, "--gres=gpu:1g.10gb:1")
    slurm.wait_state(first, "RUNNING")
    # the scheduler has had passes to start the second (CPUs and memory are free) ...
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        info = slurm.job_info(second)
        assert info["JobState"] == "PENDING", info
        time.sleep(0.2)
    # ... and says it is the device it waits for
    assert info["Reason"] in {"Resources", "Priority"}, info
    release(slurm, first)
    release(slurm, second)
    slurm.wait_state(first, "COMPLETED")
    slurm.wait_state(second, "COMPLETED", timeout=45)
    jobs = slurm.root / "jobs"
    first_end = float((jobs / f"{first}.end").read_text())
    second_start = float((jobs / f"{second}.start").read_text())
    assert second_start >= first_end


def test_shard_job_runs(slurm: SlurmCluster):
    job = slurm.sbatch('echo "SHARDS=$SLURM_SHARDS_ON_NODE"', "--gres=shard:2")
    info = slurm.wait_state(job, "COMPLETED")
    assert info["TresPerNode"] == "gres:shard:2"
    assert "SHARDS=2" in slurm.output_path(job).read_text()


def test_more_shards_than_exist_is_rejected(slurm: SlurmCluster):
    with pytest.raises(RuntimeError, match=r"(?i)requested node configuration is not available"):
        slurm.sbatch("true", "--gres=shard:9")


def test_mps_job_runs(slurm: SlurmCluster):
    job = slurm.sbatch("true", "--gres=mps:50")
    info = slurm.wait_state(job, "COMPLETED")
    assert info["TresPerNode"] == "gres:mps:50"


def test_interactive_job_requeues_a_running_preemptible_job(slurm: SlurmCluster):
    victim = slurm.sbatch(
        "echo start\n" + HOLD, "--partition=preemptible", "--requeue", "--gres=gpu:1g.10gb:1"
    )
    slurm.wait_state(victim, "RUNNING")
    started = time.monotonic()
    winner = slurm.sbatch(HOLD, "--partition=interactive", "--gres=gpu:1g.10gb:1")
    slurm.wait_state(winner, "RUNNING", timeout=30)
    info = slurm.job_info(victim)
    # REQUEUE puts the victim back in the queue (held until its BeginTime), not cancelled
    assert info["JobState"] in {"PENDING", "REQUEUED"}, info
    assert int(info["Restarts"]) == 1
    assert info["Requeue"] == "1"
    assert time.monotonic() - started < 30
    log = (slurm.root / "log" / "slurmctld.log").read_text()
    assert (
        f"preempted JobId={victim} has been requeued to reclaim resources for JobId={winner}"
        in (log)
    )
