"""How the Slurm cluster names its GPU resources: one setting for the notebook servers
(GPUSliceSlurmSpawner) and the batch jobs (``job_backend = 'slurm'``), which both turn a
gpuslice grant into ``--gres`` with :mod:`gpuslice_spawner.launchers.slurm`.

Set it once, as ``c.SlurmGresConfig.<name>`` in gpuslice_config.py: the service reads it
there, and ``configure_jupyterhub`` copies it into the hub's config for the spawner. Needs no
batchspawner (the service imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from traitlets import Bool, Dict, Enum, Integer, Unicode
from traitlets.config import Configurable

from .launchers.slurm import SlurmGres


class SlurmGresConfig(Configurable):
    """The cluster's gres names (gres.conf), for servers and batch jobs alike."""

    gres_name = Unicode(
        "gpu", help="Slurm gres name of GPUs and MIG instances (GresTypes in slurm.conf)."
    ).tag(config=True)

    gpu_gres_types = Dict(
        value_trait=Unicode(),
        help="GPU model as NVML names it -> Slurm gres type for whole-GPU grants, e.g. "
        "{'NVIDIA H100 80GB HBM3': 'h100'}. A model without an entry is requested untyped.",
    ).tag(config=True)

    gpu_memory_mib = Dict(
        value_trait=Integer(min=1),
        help="GPU model -> memory in MiB, for the service's ``gpu_backend = 'slurm'`` where "
        'the model\'s name does not say it ("NVIDIA A100-SXM4-80GB" does: 80 GiB).',
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
        "m * shards_per_gpu / 1000 shards, which must be a whole number: a share profile "
        "that is not is refused at start, naming the nearest shares that are (with 8, "
        "multiples of 125).",
    ).tag(config=True)

    mps_per_gpu = Integer(
        100,
        min=1,
        help="Count of Name=mps per GPU in gres.conf (100 makes N a percentage); a share "
        "must be a whole number of them, as with shards_per_gpu.",
    ).tag(config=True)

    pin_to_granted_host = Bool(
        True,
        help="Add --nodelist=<granted host>, so a server or job runs where gpuslice counted "
        "its slice: name the service's inventory hosts after the Slurm nodes. Turn off only "
        "if they cannot be.",
    ).tag(config=True)

    def value(self, partition: str | None = None, extra_options: Sequence[str] = ()) -> SlurmGres:
        return SlurmGres(
            gpu=self.gres_name,
            gpu_types=dict(self.gpu_gres_types),
            share=cast(Any, self.share_gres),
            shards_per_gpu=self.shards_per_gpu,
            mps_per_gpu=self.mps_per_gpu,
            pin_host=self.pin_to_granted_host,
            partition=partition or None,
            extra_options=tuple(extra_options),
        )
