"""GPUSliceSlurmSpawner: a gpuslice slice as ``--gres`` of a batchspawner Slurm job.

Entry point ``gpuslice-slurm``; needs the ``slurm`` extra (batchspawner). The package never
imports this module itself, so the local spawners work without batchspawner. As with any
batchspawner setup, ``import gpuslice_spawner.slurm`` (or ``import batchspawner``) in
jupyterhub_config.py: that registers the hub API handler the job reports its port to.
"""

from __future__ import annotations

import pwd
from typing import Any, cast

from traitlets import Bool, Dict, Enum, Integer, List, Unicode, default

from .launchers.slurm import BATCH_SCRIPT_TEMPLATE, SlurmGres, batch_script, sbatch_options
from .spawner import GPUSliceMixin

try:
    from batchspawner import SlurmSpawner
    from batchspawner.batchspawner import format_template
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "GPUSliceSlurmSpawner needs batchspawner: pip install 'gpuslice[slurm]'"
    ) from e


class GPUSliceSlurmSpawner(GPUSliceMixin, SlurmSpawner):
    """batchspawner's SlurmSpawner whose job holds exactly the slice gpuslice granted.

    Name the service's inventory hosts after the Slurm node names: the job is pinned to
    the granted host with ``--nodelist``.
    """

    batch_script = Unicode(
        BATCH_SCRIPT_TEMPLATE,
        help="batchspawner's job script template, plus the line @GPUSLICE_SBATCH@ where the "
        "grant's #SBATCH --gres/--nodelist lines go. Keep that marker after your own #SBATCH "
        "lines: the last directive wins, so nothing earlier can override the grant.",
    ).tag(config=True)

    gres_name = Unicode(
        "gpu", help="Slurm gres name of GPUs and MIG instances (GresTypes in slurm.conf)."
    ).tag(config=True)

    gpu_gres_types = Dict(
        value_trait=Unicode(),
        help="GPU model as NVML names it -> Slurm gres type for whole-GPU grants, e.g. "
        "{'NVIDIA H100 80GB HBM3': 'h100'}. A model without an entry is requested untyped.",
    ).tag(config=True)

    share_gres = Enum(
        ["shard", "mps"],
        default_value="shard",
        help="gres that time-sliced shares are requested as: 'shard' (--gres=shard:N) or "
        "'mps' (--gres=mps:N, CUDA MPS).",
    ).tag(config=True)

    shards_per_gpu = Integer(
        8,
        min=1,
        help="Count of Name=shard per GPU in gres.conf; a share of milli m asks for "
        "ceil(m * shards_per_gpu / 1000) shards.",
    ).tag(config=True)

    mps_per_gpu = Integer(
        100, min=1, help="Count of Name=mps per GPU in gres.conf (100 makes N a percentage)."
    ).tag(config=True)

    pin_to_granted_host = Bool(
        True,
        help="Add --nodelist=<granted host>, so the job runs where gpuslice counted the "
        "slice. Turn off only if the inventory's host names are not Slurm node names.",
    ).tag(config=True)

    extra_sbatch_options = List(
        Unicode(),
        help="More sbatch options (--name=value) for every server's job, e.g. "
        "['--time=08:00:00', '--qos=interactive'].",
    ).tag(config=True)

    home_dir_template = Unicode(
        "",
        help="The user's home directory on the cluster nodes ({username} is expanded): the "
        "job's working directory and log location. Empty: the hub host's passwd entry, which "
        "a containerised hub may not have.",
    ).tag(config=True)

    def gres_config(self) -> SlurmGres:
        return SlurmGres(
            gpu=self.gres_name,
            gpu_types=dict(self.gpu_gres_types),
            share=cast(Any, self.share_gres),
            shards_per_gpu=self.shards_per_gpu,
            mps_per_gpu=self.mps_per_gpu,
            pin_host=self.pin_to_granted_host,
            extra_options=tuple(self.extra_sbatch_options),
        )

    def apply_grant(self, grant: dict[str, Any]) -> None:
        # Build the options now, so a grant Slurm cannot express fails (and is released)
        # before anything is submitted.
        sbatch_options(grant, self.gres_config())
        # batchspawner computes the exported variables once per spawner object; a share's
        # memory cap variable exists only for shares, so recompute them for each grant.
        self.req_keepvars = ",".join(self.get_env())

    async def _get_batch_script(self, **subvars: Any) -> str:
        if not self.grant:
            raise RuntimeError("no gpuslice grant to submit a job for")
        template = batch_script(self.grant, self.gres_config(), self.batch_script)
        return cast(str, format_template(template, **subvars))

    def _home_dir(self) -> str:
        name = self.user.name  # type: ignore[attr-defined]
        if self.home_dir_template:
            return self.home_dir_template.format(username=name)
        return pwd.getpwnam(name).pw_dir

    @default("req_homedir")
    def _default_req_homedir(self) -> str:
        return self._home_dir()

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        env["USER"] = self.user.name  # type: ignore[attr-defined]
        env["HOME"] = self._home_dir()
        try:
            shell = pwd.getpwnam(self.user.name).pw_shell  # type: ignore[attr-defined]
        except KeyError:
            shell = ""
        if shell:
            env["SHELL"] = shell
        return env

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # slurmd picks the device and sets CUDA_VISIBLE_DEVICES in the job itself; the
        # grant's uuid names the device gpuslice counted, not necessarily that one.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env
