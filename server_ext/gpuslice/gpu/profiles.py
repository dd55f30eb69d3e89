"""MIG profile names (``1g.10gb``, ``3g.40gb``, ``1c.3g.40gb``) and compute fractions."""

from __future__ import annotations

import math
import re

from .errors import ConfigError

# Compute slices of a full MIG-capable GPU (A100/H100/H200/B200). A30 has 4; the nvml
# backend asks the driver, declared configs may say ``compute_slices``.
DEFAULT_COMPUTE_SLICES = 7

# GPU-instance sizes NVML has profiles for (NVML_GPU_INSTANCE_PROFILE_<n>_SLICE);
# "5g" or "9g" can only be typos. Whether one fits a given GPU is checked against its
# compute slices (7 by default).
VALID_GI_SLICES = frozenset({1, 2, 3, 4, 6, 7, 8})

# Media-extension variants ("1g.10gb+me", "1g.20gb+me.all", "+gfx") are separate profiles
# with the same compute and memory; the suffix is kept but does not change the size.
_PROFILE_RE = re.compile(r"^(?P<g>[0-9]+)g\.(?P<gb>[0-9]+)gb(?P<suffix>[+-][a-z][a-z0-9.,]*)?$")


def parse_mig_profile(name: object) -> tuple[int, int]:
    """``"3g.40gb"`` → ``(3, 40)``: GPU-instance compute slices and memory in GB.

    Raises :class:`ConfigError` for anything that is not a GPU-instance profile name.
    """
    example = "'1g.10gb'"
    if not isinstance(name, str):
        raise ConfigError("mig_profile", f"{name!r} is not a MIG profile name like {example}")
    m = _PROFILE_RE.match(name.strip())
    if m is None:
        raise ConfigError("mig_profile", f"{name!r} is not a MIG profile name like {example}")
    slices, gb = int(m["g"]), int(m["gb"])
    if slices not in VALID_GI_SLICES or gb <= 0:
        raise ConfigError("mig_profile", f"{name!r} is not a MIG profile name like {example}")
    return slices, gb


def compute_milli(slices: int, total_slices: int = DEFAULT_COMPUTE_SLICES) -> int:
    """Compute fraction in milli-GPU: ``Ng`` of a 7-slice GPU is ``N*1000//7`` (1g → 142)."""
    return min(1000, slices * 1000 // max(1, total_slices))


def profile_memory_gb(instance_mib: int, gpu_total_mib: int) -> int:
    """The ``Ngb`` part of a profile name, computed the way NVIDIA's tools name profiles.

    It is not the instance's size in GiB (a 7g on an A100-80GB has 80896 MiB, 79 GiB, and
    is still "7g.80gb"): the instance's fraction of the GPU's memory is rounded up to an
    eighth and multiplied by the GPU's memory in whole GiB, rounded half away from zero.
    This matches nvidia-smi and go-nvlib: A100-40GB 1g → 5gb, A100-80GB 1g → 10gb,
    H200 1g → 18gb, 3g → 71gb.
    """
    if gpu_total_mib <= 0 or instance_mib <= 0:
        return max(0, round(instance_mib / 1024))
    fraction = math.ceil(instance_mib / gpu_total_mib * 8) / 8
    total_gb = math.ceil(gpu_total_mib / 1024)
    return math.floor(fraction * total_gb + 0.5)


def profile_name(gi_slices: int, memory_gb: int, ci_slices: int | None = None) -> str:
    """``(3, 40)`` → ``"3g.40gb"``; a compute instance smaller than its GPU instance is
    named as nvidia-smi does, ``"1c.3g.40gb"``."""
    base = f"{gi_slices}g.{memory_gb}gb"
    if ci_slices is not None and 0 < ci_slices < gi_slices:
        return f"{ci_slices}c.{base}"
    return base
