"""FGD's fragmentation measure, for many (hypothetical) hosts at once.

For a typical request t, a host's free GPU milli is *usable* when t fits there (its CPU, and
``count_t`` allowed GPUs with free >= milli_t): then the usable part is the free milli on
those GPUs, the rest is fragment. When t does not fit, all free milli is fragment for t.
F = sum_t weight_t * (free - usable_t), in milli-GPU, with weights that sum to 1.

Computed exactly: with the weights as request counts (``Typical.weight``), every product
and sum is of integers well below 2**53, so F times the weights' sum is exact in float64
whatever order a BLAS kernel adds in. A placement that leaves fragmentation as it was then
scores a delta of exactly 0. In floating point that delta came out a few ulps either side
of 0, so the same host scored 49 or 50 on FGD's sigmoid by rounding. Which side depended
on the BLAS kernel the CPU got, so a simulation gave other figures on another machine.
"""

from __future__ import annotations

import numpy as np

from .typical import Typical


def allowed_by_typical(typical: Typical, models: list[str]) -> np.ndarray:
    """bool[M, T]: which GPU models each typical request may use."""
    out = np.ones((len(models), typical.weight.size), bool)
    for t, allowed in enumerate(typical.models):
        if allowed:
            out[:, t] = [m in allowed for m in models]
    return out


def fragmentation(
    typical: Typical,
    free: np.ndarray,
    ok: np.ndarray,
    cpu_free: np.ndarray,
    model: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
    packed: bool = False,
    mem_free: np.ndarray | None = None,
    scaled: bool = False,
) -> np.ndarray:
    """float64[K]: F for K hosts given free milli ``free[K, G]`` on slots ``ok[K, G]``.

    ``model[K, G]`` and ``allowed[M, T]`` are needed only when some typical request restricts
    GPU models. With ``mem_free[K]`` and typical memories, t must also fit the host memory.
    ``scaled``: F times the weights' sum, exact with integral weights (the module's
    docstring): compare or subtract these, and divide once.
    """
    free = np.where(ok, free, 0)
    total = free.sum(1)
    ge = free[:, :, None] >= typical.milli[None, None, :]  # K, G, T
    ge &= ok[:, :, None]
    if model is not None and allowed is not None and not typical.any_model:
        ge &= allowed[model]
    n_ge = ge.sum(1)
    if packed:
        usable = packed_usable(typical, free, ge, n_ge, cpu_free)
    else:
        usable = np.einsum("kg,kgt->kt", free, ge)
        fits = (n_ge >= typical.count) & (cpu_free[:, None] >= typical.cpu) & (typical.count > 0)
        if mem_free is not None and typical.mem is not None:
            fits &= mem_free[:, None] >= typical.mem
        usable = np.where(fits, usable, 0)
    weights = typical.weight.sum()
    times_weights = total * weights - usable @ typical.weight
    return times_weights if scaled else times_weights / weights


def packed_usable(
    typical: Typical, free: np.ndarray, ge: np.ndarray, n_ge: np.ndarray, cpu_free: np.ndarray
) -> np.ndarray:
    """float[K, T]: GPU milli that copies of t would use if only t arrived from now on.

    A refinement of FGD's rule: it counts how many copies of t fit (by GPU and by CPU), not
    just whether one does, so GPUs that CPU or leftovers would strand count as fragment.
    """
    milli = np.maximum(typical.milli, 1)
    per_gpu = np.where(ge, free[:, :, None] // milli[None, None, :], 0).sum(1)
    by_gpu = np.where(typical.milli >= 1000, n_ge // np.maximum(typical.count, 1), per_gpu)
    by_cpu = cpu_free[:, None] // np.maximum(typical.cpu, 1)
    by_cpu = np.where(typical.cpu > 0, by_cpu, by_gpu)
    copies = np.minimum(by_gpu, by_cpu) * (typical.count > 0)
    return copies * typical.count * typical.milli
