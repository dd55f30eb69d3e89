"""The fewest GPUs that hold a node's MIG instances, found exactly.

An engine advertises MIG instances per node and profile (the device plugin's
``nvidia.com/mig-<profile>`` resources), not which GPU holds which. The ledger needs GPUs,
so it rebuilds them: every instance on a GPU of the node's model, no GPU holding more
compute slices (7) or memory than it has, and as few GPUs as that allows, since every other
GPU is advertised as a whole one. First-fit largest-first is not enough: two A100s each
split 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb come out as three GPUs that way (two 3g
instances fill the first one's memory), and the node's fourth GPU, a whole one, was lost.

The search is over a handful of GPUs of a node: a depth-first fill of ``k`` GPUs, from the
lower bound (compute and memory summed) up to what first-fit found, the largest instances
first, never trying two GPUs that are filled alike.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from gpuslice.gpu.profiles import DEFAULT_COMPUTE_SLICES, parse_mig_profile

# Steps the search may take per GPU count before settling for what first-fit found: a
# node's instances are a few dozen at most, found in far fewer
MAX_STEPS = 200_000


def pack_mig_exact(instances: Counter[str], model: str, memory_mib: int) -> list[dict[str, Any]]:
    """GPUs of ``model`` holding ``instances`` (MIG profile -> count), as the static
    backend's ``gpus`` entries, on as few GPUs as they fit. ValueError when an instance
    is larger than a GPU of the model."""
    gpu_gb = math.ceil(memory_mib / 1024)
    sized = sorted(
        ((*parse_mig_profile(p), p) for p, n in instances.items() for _ in range(n)), reverse=True
    )
    for slices, gb, profile in sized:
        if slices > DEFAULT_COMPUTE_SLICES or gb > gpu_gb:
            raise ValueError(f"a {profile} instance does not fit on a GPU of {gpu_gb} GB")
    best = _first_fit(sized, gpu_gb)
    lower = max(
        math.ceil(sum(s for s, _, _ in sized) / DEFAULT_COMPUTE_SLICES),
        math.ceil(sum(g for _, g, _ in sized) / gpu_gb),
    )
    for k in range(lower, len(best)):
        found = _fill(sized, k, gpu_gb)
        if found is not None:
            best = found
            break
    return [{"model": model, "memory_mib": memory_mib, "mig": layout} for layout in best if layout]


def _first_fit(sized: list[tuple[int, int, str]], gpu_gb: int) -> list[list[str]]:
    layouts: list[list[str]] = []
    used: list[tuple[int, int]] = []
    for slices, gb, profile in sized:
        for i, (s, g) in enumerate(used):
            if s + slices <= DEFAULT_COMPUTE_SLICES and g + gb <= gpu_gb:
                layouts[i].append(profile)
                used[i] = (s + slices, g + gb)
                break
        else:
            layouts.append([profile])
            used.append((slices, gb))
    return layouts


def _fill(sized: list[tuple[int, int, str]], k: int, gpu_gb: int) -> list[list[str]] | None:
    """Every instance on ``k`` GPUs, or None (none found within :data:`MAX_STEPS`)."""
    used = [[0, 0] for _ in range(k)]
    layouts: list[list[str]] = [[] for _ in range(k)]
    steps = 0

    def place(i: int) -> bool:
        nonlocal steps
        if i == len(sized):
            return True
        steps += 1
        if steps > MAX_STEPS:
            return False
        slices, gb, profile = sized[i]
        tried: set[tuple[int, int]] = set()
        for gpu in range(k):
            load = (used[gpu][0], used[gpu][1])
            # two GPUs filled alike lead to the same outcomes: try one of them
            if load in tried:
                continue
            tried.add(load)
            if load[0] + slices > DEFAULT_COMPUTE_SLICES or load[1] + gb > gpu_gb:
                continue
            used[gpu][0] += slices
            used[gpu][1] += gb
            layouts[gpu].append(profile)
            if place(i + 1):
                return True
            layouts[gpu].pop()
            used[gpu][0] -= slices
            used[gpu][1] -= gb
        return False

    return layouts if place(0) else None
