"""GPUSliceSlurmSpawner's job script and environment, without Slurm or a hub."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from traitlets.config import Config

from tests.harness.engines import need_module

need_module("batchspawner")

from gpuslice_spawner.slurm import GPUSliceSlurmSpawner  # noqa: E402

MIG = {
    "id": 5,
    "profile": "mig-1g.10gb",
    "kind": "mig",
    "host": "gpu-node-3",
    "assignments": [
        {
            "gpu_uuid": "GPU-1",
            "gpu_model": "NVIDIA A100-SXM4-80GB",
            "milli": 142,
            "memory_mib": 10240,
            "mig_uuid": "MIG-1",
            "mig_profile": "1g.10gb",
        }
    ],
}
SHARE = {
    **MIG,
    "kind": "share",
    "profile": "share-250",
    "assignments": [dict(MIG["assignments"][0], milli=250, mig_uuid=None, mig_profile=None)],
}


def spawner(gres: dict[str, Any] | None = None, **traits: Any) -> GPUSliceSlurmSpawner:
    """``gres``: the shared ``c.SlurmGresConfig`` settings."""
    user = SimpleNamespace(name="nobody-here-xyz", id=3, url="/user/x/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    traits.setdefault("home_dir_template", "/cluster/home/{username}")
    config = Config({"SlurmGresConfig": gres or {}})
    return GPUSliceSlurmSpawner(user=user, hub=hub, config=config, **traits)


async def script_for(s: GPUSliceSlurmSpawner, grant: dict[str, Any]) -> str:
    s.grant = grant
    s.apply_grant(grant)
    subvars = s.get_req_subvars()
    subvars["cmd"] = "jupyterhub-singleuser"
    # what batchspawner does with the (untrusted) spawn options
    subvars.update({"profile": grant["profile"], "options": "--gres=gpu:7g.80gb:1"})
    return await s._get_batch_script(**subvars)


async def test_the_grant_comes_last_so_options_cannot_override_it():
    script = await script_for(spawner(req_partition="interactive"), MIG)
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=interactive" in lines
    assert "#SBATCH --chdir=/cluster/home/nobody-here-xyz" in lines
    assert lines[-2:] == ["#SBATCH --gres=gpu:1g.10gb:1", "#SBATCH --nodelist=gpu-node-3"]


async def test_share_as_mps_with_extra_options_and_no_pinning():
    s = spawner(
        {"share_gres": "mps", "pin_to_granted_host": False},
        extra_sbatch_options=["--time=8:00:00"],
    )
    script = await script_for(s, SHARE)
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert lines[-2:] == ["#SBATCH --gres=mps:25", "#SBATCH --time=8:00:00"]
    assert "--nodelist" not in script


async def test_exported_variables_follow_the_grant():
    s = spawner()
    await script_for(s, MIG)
    assert "GPUSLICE_MEMORY_CAP_MIB" not in s.req_keepvars.split(",")
    await script_for(s, SHARE)
    keep = s.req_keepvars.split(",")
    assert "GPUSLICE_MEMORY_CAP_MIB" in keep and "GPUSLICE_ALLOCATION_ID" in keep
    # slurmd sets the visible devices in the job
    assert "CUDA_VISIBLE_DEVICES" not in keep
    assert s.get_env()["HOME"] == "/cluster/home/nobody-here-xyz"


async def test_a_template_without_the_marker_is_refused():
    s = spawner(batch_script="#!/bin/bash\n{{cmd}}\n")
    with pytest.raises(ValueError, match="@GPUSLICE_SBATCH@"):
        await script_for(s, MIG)


def test_a_grant_slurm_cannot_express_fails_before_submission():
    bad = dict(MIG, host="node;rm -rf /")
    with pytest.raises(ValueError, match="not a Slurm node name"):
        spawner().apply_grant(bad)


async def test_servers_can_be_told_a_service_url_they_can_reach():
    s = spawner()
    await script_for(s, MIG)
    assert s.get_env()["GPUSLICE_SERVICE_URL"] == s.service_url  # the hub's own address
    s.server_service_url = "https://hub.example.org/services/gpuslice/"
    assert s.get_env()["GPUSLICE_SERVICE_URL"] == "https://hub.example.org/services/gpuslice/"


async def test_batchspawner_fields_sit_beside_the_slice_and_are_checked(monkeypatch):
    """An admin's own fields (here the job's run time, which batchspawner puts where
    req_runtime goes) are shown below the slice choice in one form and reach the job
    script; the old mixin's form replaced them, or they replaced the slice's (issue 46).
    User options are untrusted: only allowed_user_options, each matching its pattern."""
    from gpuslice_hub.client import ServiceClient
    from gpuslice_spawner.spawner import SliceRefused

    async def request(_client: Any, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        assert (method, path) == ("GET", "api/profiles")
        return {
            "user": "x",
            "simulated": False,
            "profiles": [{"name": "mig-1g.10gb", "available": True, "free": 1, "total": 1}],
        }

    monkeypatch.setattr(ServiceClient, "request", request)
    s = spawner(
        options_form=(
            '<label>Run time <select name="runtime"><option>1:00:00</option>'
            "<option>4:00:00</option></select></label>"
        ),
        options_from_form="simple",
        allowed_user_options={"runtime": r"[1-8]:00:00"},
    )
    html = await s.get_options_form()
    assert 'name="slice" value="mig-1g.10gb"' in html and '<select name="runtime">' in html
    assert html.index('name="slice"') < html.index('name="runtime"')
    s.user_options = await s.run_options_from_form(
        {"slice": ["mig-1g.10gb"], "runtime": ["4:00:00"]}
    )
    assert s.user_options == {"slice": "mig-1g.10gb", "runtime": "4:00:00"}

    for forged in ("4:00:00\n#SBATCH --qos=high", "99:00:00", ["4:00:00"]):
        with pytest.raises(SliceRefused, match="'runtime' must be a string matching"):
            await s.check_wrapped_options({"runtime": forged})
    with pytest.raises(SliceRefused, match="Unknown spawn option 'partition'"):
        await s.check_wrapped_options({"runtime": "4:00:00", "partition": "gpu-long"})
    await s.check_wrapped_options({"runtime": "4:00:00"})

    # batchspawner's own submission: the user's run time, then the grant's lines
    sent: list[str] = []

    async def run_command(cmd: str, input: str | None = None, env: Any = None) -> str:
        sent.append(input or "")
        return "4242"

    s.run_command = run_command  # type: ignore[method-assign]
    s.grant = MIG
    s.apply_grant(MIG)
    assert await s.submit_batch_script() == "4242"
    lines = [line for line in sent[0].splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --time=4:00:00" in lines
    assert lines[-2:] == ["#SBATCH --gres=gpu:1g.10gb:1", "#SBATCH --nodelist=gpu-node-3"]
