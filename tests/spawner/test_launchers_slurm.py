"""Grant -> sbatch options and batch script; the script is also run on a real Slurm."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from batchspawner.batchspawner import format_template

from gpuslice_spawner.launchers.slurm import (
    BATCH_SCRIPT_TEMPLATE,
    SlurmGres,
    batch_script,
    grants_sbatch_options,
    gres_spec,
    sbatch_options,
)
from tests.harness.slurm import SlurmCluster

H100 = "NVIDIA H100 80GB HBM3"


def assignment(**fields: Any) -> dict[str, Any]:
    base = {
        "gpu_uuid": "GPU-5f1c7a0e-0000-0000-0000-000000000001",
        "gpu_model": H100,
        "milli": 1000,
        "memory_mib": 81559,
        "mig_uuid": None,
        "mig_profile": None,
    }
    return {**base, **fields}


def grant(kind: str, *assignments: dict[str, Any], host: str = "node1") -> dict[str, Any]:
    return {"id": 17, "profile": "p", "kind": kind, "host": host, "assignments": list(assignments)}


MIG = grant("mig", assignment(milli=142, memory_mib=18432, mig_uuid="MIG-1", mig_profile="1g.18gb"))
SHARE = grant("share", assignment(milli=250, memory_mib=10240))
GPUS = grant("gpu", assignment(), assignment(gpu_uuid="GPU-2"))


def test_mig_is_one_gpu_of_the_profile_type_on_the_granted_host():
    assert sbatch_options(MIG) == ["--gres=gpu:1g.18gb:1", "--nodelist=node1"]


def test_whole_gpus_typed_per_model_or_untyped():
    typed = SlurmGres(gpu_types={H100: "h100"})
    assert gres_spec(GPUS, typed) == "gpu:h100:2"
    assert gres_spec(GPUS) == "gpu:2"


def test_a_gpu_of_any_model_asks_for_the_one_whole_gpu_type():
    # a batch job's whole GPU, no model named (Slurm picks the node): an untyped "gpu:1"
    # was given MIG instances (gpu:1g.10gb) on a real cluster, counted as whole GPUs
    anyone = grant("gpu", assignment(gpu_model=None), host="")
    assert gres_spec(anyone, SlurmGres(gpu_types={H100: "h100"})) == "gpu:h100:1"
    # with several types nothing says which: untyped (and the service warns at start)
    two = SlurmGres(gpu_types={H100: "h100", "NVIDIA A100-SXM4-80GB": "a100"})
    assert gres_spec(anyone, two) == "gpu:1"
    # a grant that names a model keeps it, typed or not
    assert gres_spec(GPUS, two) == "gpu:h100:2"


def test_share_as_shards_scales_milli_to_shards_per_gpu():
    assert gres_spec(SHARE) == "shard:2"  # 250/1000 of 8
    assert gres_spec(SHARE, SlurmGres(shards_per_gpu=16)) == "shard:4"
    # exactly, never rounded: 100 milli of 8 shards would be 0.8 shards, and one shard holds
    # 125 milli of the GPU where the ledger charged 100 (Slurm then places others elsewhere)
    small = grant("share", assignment(milli=100))
    with pytest.raises(ValueError, match=r"nearest that are: 125 \(1 shard\)$"):
        gres_spec(small)
    with pytest.raises(ValueError, match=r"300 .* 250 \(2 shards\) or 375 \(3 shards\)"):
        gres_spec(grant("share", assignment(milli=300)))


def test_share_as_mps_is_a_percentage():
    assert gres_spec(SHARE, SlurmGres(share="mps")) == "mps:25"
    assert gres_spec(SHARE, SlurmGres(share="mps", mps_per_gpu=1000)) == "mps:250"
    with pytest.raises(ValueError, match=r"250 \(25 mps\) or 260 \(26 mps\)"):
        gres_spec(grant("share", assignment(milli=255)), SlurmGres(share="mps"))


def test_a_job_of_several_slices_asks_for_their_sum_on_their_one_host():
    other_mig = copy.deepcopy(MIG)
    assert grants_sbatch_options([MIG, other_mig, GPUS]) == [
        "--gres=gpu:1g.18gb:2,gpu:2",
        "--nodelist=node1",
    ]
    shares = [SHARE, copy.deepcopy(SHARE)]
    assert grants_sbatch_options(shares, SlurmGres(partition="batch")) == [
        "--gres=shard:4",
        "--nodelist=node1",
        "--partition=batch",
    ]


def test_slices_on_several_hosts_cannot_be_pinned_as_one_job():
    elsewhere = {**SHARE, "host": "node2"}
    assert grants_sbatch_options([SHARE, elsewhere]) == ["--gres=shard:4"]
    with pytest.raises(ValueError, match="no grants"):
        grants_sbatch_options([])


def test_partition_extra_options_and_unpinned_host():
    cfg = SlurmGres(pin_host=False, partition="interactive", extra_options=["--time=08:00:00"])
    assert sbatch_options(MIG, cfg) == [
        "--gres=gpu:1g.18gb:1",
        "--partition=interactive",
        "--time=08:00:00",
    ]


@pytest.mark.parametrize(
    "bad, config, message",
    [
        (grant("tpu", assignment()), None, "unknown kind"),
        (grant("mig"), None, "no assignments"),
        (grant("mig", assignment(mig_profile=None)), None, "mig_profile"),
        (grant("mig", assignment(mig_profile="1g.18gb\n#SBATCH --x")), None, "gres"),
        (grant("share", assignment(milli=1001)), None, "out of range"),
        (grant("share", assignment(milli=1), assignment(milli=1)), None, "exactly one"),
        (grant("gpu", assignment(), host="node1;rm"), None, "node name"),
        (GPUS, SlurmGres(gpu_types={H100: "{{x}}"}), "gres"),
        (GPUS, SlurmGres(extra_options=["--time=1\n#SBATCH --x"]), "extra sbatch option"),
    ],
)
def test_malformed_input_is_refused(bad: dict[str, Any], config: SlurmGres | None, message: str):
    with pytest.raises(ValueError, match=message):
        sbatch_options(bad, config)


SUBVARS = {
    "homedir": "/home/alice",
    "keepvars": "PATH,JUPYTERHUB_API_TOKEN",
    "partition": "",
    "runtime": "",
    "memory": "",
    "nprocs": "",
    "reservation": "",
    "options": "",
    "prologue": "",
    "epilogue": "",
    "srun": "srun",
    "cmd": "batchspawner-singleuser jupyterhub-singleuser",
}


def directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_batch_script_renders_through_batchspawner_with_the_grant_last():
    template = batch_script(MIG)
    assert "{{cmd}}" in template  # still a batchspawner template
    # user_options can override template variables; the grant's lines must win anyway
    rendered = format_template(template, **{**SUBVARS, "options": "--gres=gpu:7g.80gb:1"})
    assert directives(rendered) == [
        "#SBATCH --output=/home/alice/jupyterhub_slurmspawner_%j.log",
        "#SBATCH --job-name=spawner-jupyterhub",
        "#SBATCH --chdir=/home/alice",
        "#SBATCH --export=PATH,JUPYTERHUB_API_TOKEN",
        "#SBATCH --get-user-env=L",
        "#SBATCH --gres=gpu:7g.80gb:1",
        "#SBATCH --gres=gpu:1g.18gb:1",
        "#SBATCH --nodelist=node1",
    ]
    body = rendered.split("\n\n", 1)[1]
    assert "srun batchspawner-singleuser jupyterhub-singleuser\n" in body
    assert "#SBATCH" not in body  # sbatch ignores directives after the first command


def test_batch_script_requires_the_marker_once():
    with pytest.raises(ValueError, match="exactly once"):
        batch_script(MIG, template="#!/bin/bash\n{{cmd}}\n")
    assert BATCH_SCRIPT_TEMPLATE.count("@GPUSLICE_SBATCH@") == 1


# --- on a real Slurm ---------------------------------------------------------------

HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.1; done'


@pytest.mark.slurm
@pytest.mark.parametrize(
    "kind, config, tres_per_node, env_var",
    [
        ("mig", SlurmGres(), "gres:gpu:1g.10gb:1", "CUDA_VISIBLE_DEVICES"),
        ("gpu", SlurmGres(gpu_types={H100: "a100"}), "gres:gpu:a100:2", "CUDA_VISIBLE_DEVICES"),
        ("share", SlurmGres(), "gres:shard:2", "SLURM_SHARDS_ON_NODE"),
    ],
)
def test_rendered_script_runs_on_slurm_with_the_granted_gres(
    slurm: SlurmCluster, kind: str, config: SlurmGres, tres_per_node: str, env_var: str
):
    node = slurm.node.name
    grants = {
        "mig": grant(
            "mig", assignment(milli=142, mig_uuid="MIG-1", mig_profile="1g.10gb"), host=node
        ),
        "gpu": grant("gpu", assignment(), assignment(gpu_uuid="GPU-2"), host=node),
        "share": grant("share", assignment(milli=250), host=node),
    }
    jobs = slurm.root / "jobs"
    # what batchspawner does: render its batch_script, pipe it into `sbatch --parsable`
    script = format_template(
        batch_script(copy.deepcopy(grants[kind]), config),
        **{
            **SUBVARS,
            "homedir": str(jobs),
            "keepvars": "ALL",
            "partition": "interactive",
            "cmd": f"bash -c 'echo {env_var}=${env_var}; {HOLD}'",
        },
    )
    job = slurm.run("sbatch", "--parsable", input=script).stdout.strip().split(";")[0]
    info = slurm.wait_state(job, "RUNNING")
    assert info["TresPerNode"] == tres_per_node
    assert info["Partition"] == "interactive"
    assert info["NodeList"] == node
    (jobs / f"{job}.release").touch()
    slurm.wait_state(job, "COMPLETED")
    out = (jobs / f"jupyterhub_slurmspawner_{job}.log").read_text()
    # the srun step inside the job sees the device(s) slurmd gave the job
    seen = [line for line in out.splitlines() if line.startswith(f"{env_var}=")]
    assert seen and seen[0] != f"{env_var}=", out
    if kind == "mig":
        idx = info["GRES"].split("IDX:")[1].rstrip(")")
        assert seen[0] == f"CUDA_VISIBLE_DEVICES={idx}"
    if kind == "gpu":
        assert len(seen[0].split("=")[1].split(",")) == 2
    assert "jupyterhub-singleuser ended gracefully" in out
