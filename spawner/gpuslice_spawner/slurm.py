"""GPUSliceSlurmSpawner: a gpuslice slice as ``--gres`` of a batchspawner Slurm job.

Entry point ``gpuslice-slurm``; needs the ``slurm`` extra (batchspawner). The package never
imports this module itself, so the local spawners work without batchspawner. As with any
batchspawner setup, ``import gpuslice_spawner.slurm`` (or ``import batchspawner``) in
jupyterhub_config.py: that registers the hub API handler the job reports its port to.
"""

from __future__ import annotations

import pwd
from typing import Any, cast

from traitlets import List, Unicode, default

from .launchers.slurm import BATCH_SCRIPT_TEMPLATE, SlurmGres, batch_script, sbatch_options
from .slurm_gres import SlurmGresConfig
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
    the granted host with ``--nodelist``. The cluster's gres names are ``c.SlurmGresConfig``
    (in gpuslice_config.py, shared with the service's Slurm jobs).
    """

    engine_counts_shares = True  # (replicas or shards: never overcommitted)

    batch_script = Unicode(
        BATCH_SCRIPT_TEMPLATE,
        help="batchspawner's job script template, plus the line @GPUSLICE_SBATCH@ where the "
        "grant's #SBATCH --gres/--nodelist lines go. Keep that marker after your own #SBATCH "
        "lines: the last directive wins, so nothing earlier can override the grant.",
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
        # the cluster's gres names: c.SlurmGresConfig, shared with the service's Slurm jobs
        return SlurmGresConfig(parent=self).value(extra_options=self.extra_sbatch_options)

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
