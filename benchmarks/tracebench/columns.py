"""Protocol section 5: allocation averaged per arrival percentage."""

from __future__ import annotations

import numpy as np


def py_round(x: float, ndigits: int = 0) -> float:
    """Python's own round (half to even on the binary value), as the merge script used."""
    return round(float(x), ndigits)


def columns(
    arrived: np.ndarray,
    used: np.ndarray,
    total_gpus: int,
    ks: tuple[int, ...] = (100, 110, 120, 130),
) -> dict[str, float | None]:
    """Column k: mean of round(used %, 2) over rows whose rounded arrived % is k.

    Falls back to rows with k-1 <= a <= k+1, then to an empty cell (None).
    """
    # Two divisions, as the merge script wrote them, so halves round the same way.
    a = np.array([py_round(x / total_gpus / 10) for x in arrived])
    u = np.array([py_round(x / total_gpus / 10, 2) for x in used])
    out: dict[str, float | None] = {}
    for k in ks:
        sel = u[a == k]
        if sel.size == 0:
            sel = u[(a >= k - 1) & (a <= k + 1)]
        out[str(k)] = py_round(sel.mean(), 2) if sel.size else None
    return out
