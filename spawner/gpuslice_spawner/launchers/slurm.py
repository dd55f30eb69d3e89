"""Turn a gpuslice grant into sbatch options and a batchspawner batch script (pure).

Slurm, unlike Kubernetes, could be told which device to use, but only through gres
*types* and counts: the grant is translated into the same kind and amount of gres on the
host the service placed it on, and slurmd picks the device (and sets
``CUDA_VISIBLE_DEVICES``).

* MIG instance -> ``--gres=gpu:<mig profile>:1`` (Slurm's NVML autodetect names MIG gres
  types after the profile, e.g. ``1g.10gb``).
* whole GPUs  -> ``--gres=gpu:<type>:N``; the type per GPU model comes from config, a model
  without one is requested untyped (``gpu:N``).
* share       -> ``--gres=shard:N`` with N = milli scaled to the shards per GPU, or
  ``--gres=mps:N`` with N = milli scaled to the MPS count per GPU (100: a percentage):
  exactly, a share that is no whole number of them is refused (:func:`share_units`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# Everything that ends up in the script goes through these: the script is a bash file
# *and* a Jinja template, so a newline, '#', '{' or '%' from a grant would be able to add
# directives, shell code or template logic.
_GRES_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_OPTION = re.compile(r"--[a-z][a-z-]*(?:=[A-Za-z0-9._:,/+@%=-]+)?")

GRANT_MARKER = "@GPUSLICE_SBATCH@"

# batchspawner's SlurmSpawner contract ({{homedir}}, {{keepvars}}, {{cmd}}, ... rendered by
# batchspawner), with the grant's directives pasted in as literal text at GRANT_MARKER.
# They are deliberately not template variables: batchspawner lets user_options (untrusted)
# override any template variable, and they come last so that an #SBATCH --gres or
# --nodelist in `options` cannot override them either (the last directive wins).
BATCH_SCRIPT_TEMPLATE = """\
#!/bin/bash
#SBATCH --output={{homedir}}/jupyterhub_slurmspawner_%j.log
#SBATCH --job-name=spawner-jupyterhub
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if reservation %}#SBATCH --reservation={{reservation}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}@GPUSLICE_SBATCH@

set -euo pipefail

trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""


@dataclass(frozen=True)
class SlurmGres:
    """How the Slurm cluster names its GPU resources."""

    gpu: str = "gpu"
    # NVML model name -> gres type, e.g. {"NVIDIA H100 80GB HBM3": "h100"}
    gpu_types: Mapping[str, str] = field(default_factory=dict)
    share: Literal["shard", "mps"] = "shard"
    shards_per_gpu: int = 8  # the Count of Name=shard per GPU in gres.conf
    mps_per_gpu: int = 100  # the Count of Name=mps per GPU; 100 makes N a percentage
    pin_host: bool = True  # --nodelist=<grant host>, so the service's ledger stays true
    partition: str | None = None
    extra_options: Sequence[str] = ()


def _token(value: object, what: str) -> str:
    text = str(value)
    if not _GRES_TOKEN.fullmatch(text):
        raise ValueError(f"{what} {value!r} cannot be used in a gres specification")
    return text


def gres_counts(grant: Mapping[str, Any], config: SlurmGres | None = None) -> Counter[str]:
    """The gres ``grant`` holds, e.g. ``{"gpu:1g.10gb": 1}`` or ``{"shard": 2}``."""
    cfg = config or SlurmGres()
    kind = grant.get("kind")
    assignments = list(grant.get("assignments") or [])
    if not assignments:
        raise ValueError(f"grant {grant.get('id')} has no assignments")

    counts: Counter[str] = Counter()
    if kind == "mig":
        for a in assignments:
            if not a.get("mig_profile"):
                raise ValueError(f"MIG assignment without mig_profile: {dict(a)!r}")
            counts[f"{cfg.gpu}:{_token(a['mig_profile'], 'MIG profile')}"] += 1
    elif kind == "gpu":
        whole = set(cfg.gpu_types.values())
        for a in assignments:
            gtype = cfg.gpu_types.get(str(a.get("gpu_model")))
            if a.get("gpu_model") is None and len(whole) == 1:
                # Any model (a batch job's, where Slurm picks the node): the cluster's one
                # whole-GPU type. An untyped "gpu" may be given a MIG instance's gres.
                (gtype,) = whole
            counts[f"{cfg.gpu}:{_token(gtype, 'GPU type')}" if gtype else cfg.gpu] += 1
    elif kind == "share":
        if len(assignments) != 1:
            raise ValueError(f"a share grant holds exactly one GPU share, got {len(assignments)}")
        milli = int(assignments[0].get("milli") or 0)
        if not 0 < milli <= 1000:
            raise ValueError(f"share of {milli} milli-GPU is out of range")
        # exactly: a share rounded up to whole shards holds more of the GPU than the ledger
        # charged, and Slurm then places others where the ledger thinks there is room
        counts[cfg.share] = share_units(milli, cfg)
    else:
        raise ValueError(f"grant {grant.get('id')} has unknown kind {kind!r}")
    return counts


def share_units(milli: int, config: SlurmGres | None = None) -> int:
    """How many of Slurm's share units (``shard`` or ``mps``) a share of ``milli``
    milli-GPUs is: exactly a whole number of them, or ValueError naming the nearest shares
    that are (Slurm counts units, the ledger milli-GPUs: they must agree)."""
    cfg = config or SlurmGres()
    per_gpu = cfg.shards_per_gpu if cfg.share == "shard" else cfg.mps_per_gpu
    units, rest = divmod(milli * per_gpu, 1000)
    if rest == 0 and units >= 1:
        return units
    whole = [n * 1000 // per_gpu for n in range(1, per_gpu + 1) if n * 1000 % per_gpu == 0]
    below = [m for m in whole if m < milli][-1:]
    above = [m for m in whole if m > milli][:1]
    nearest = " or ".join(f"{m} ({_units(m * per_gpu // 1000, cfg.share)})" for m in below + above)
    raise ValueError(
        f"a share of {milli} milli-GPU is no whole number of Slurm's {cfg.share} units "
        f"({per_gpu} per GPU, each {1000 / per_gpu:g} milli-GPU); the nearest that are: "
        f"{nearest}"
    )


def _units(n: int, name: str) -> str:
    return f"{n} {name}" if name == "mps" or n == 1 else f"{n} {name}s"


def _joined(counts: Counter[str]) -> str:
    return ",".join(f"{name}:{n}" for name, n in counts.items())


def gres_spec(grant: Mapping[str, Any], config: SlurmGres | None = None) -> str:
    """The ``--gres`` value for ``grant``, e.g. ``gpu:1g.10gb:1`` or ``shard:2``."""
    return _joined(gres_counts(grant, config))


def _placement_options(host: object, cfg: SlurmGres) -> list[str]:
    """``--nodelist`` (the granted host), the partition and the site's extra options."""
    options = []
    if cfg.pin_host and host:
        if not _HOSTNAME.fullmatch(str(host)):
            raise ValueError(f"host {host!r} is not a Slurm node name")
        options.append(f"--nodelist={host}")
    if cfg.partition:
        options.append(f"--partition={_token(cfg.partition, 'partition')}")
    for option in cfg.extra_options:
        if not _OPTION.fullmatch(option):
            raise ValueError(f"extra sbatch option {option!r} is not --name[=value]")
        options.append(option)
    return options


def sbatch_options(grant: Mapping[str, Any], config: SlurmGres | None = None) -> list[str]:
    """sbatch options that make a job hold what ``grant`` holds."""
    cfg = config or SlurmGres()
    return [f"--gres={gres_spec(grant, cfg)}", *_placement_options(grant.get("host"), cfg)]


def grants_sbatch_options(
    grants: Sequence[Mapping[str, Any]], config: SlurmGres | None = None
) -> list[str]:
    """sbatch options that make one job hold what all of ``grants`` hold (a batch job of
    several slices): their gres summed, pinned to their host when they share one.

    Slurm's ``--gres`` is per node: slices the ledger placed on different hosts cannot be
    pinned as one single-node job, so such a job is submitted without ``--nodelist`` (the
    admin guide says so)."""
    if not grants:
        raise ValueError("no grants to translate")
    cfg = config or SlurmGres()
    total: Counter[str] = Counter()
    for grant in grants:
        total.update(gres_counts(grant, cfg))
    hosts = {grant.get("host") for grant in grants}
    host = next(iter(hosts)) if len(hosts) == 1 else None
    return [f"--gres={_joined(total)}", *_placement_options(host, cfg)]


def batch_script(
    grant: Mapping[str, Any],
    config: SlurmGres | None = None,
    template: str = BATCH_SCRIPT_TEMPLATE,
) -> str:
    """A ``SlurmSpawner.batch_script`` for ``grant``: ``template`` with the grant's
    ``#SBATCH`` lines in place of ``@GPUSLICE_SBATCH@``; batchspawner renders the rest."""
    if template.count(GRANT_MARKER) != 1:
        raise ValueError(f"the batch script template must contain {GRANT_MARKER} exactly once")
    directives = "\n".join(f"#SBATCH {option}" for option in sbatch_options(grant, config))
    return template.replace(GRANT_MARKER, directives)
