"""What the service takes from a runner's ``state.json``.

The file is in the job's folder, which the job's own code can write: the service treats it
as a claim, not a fact. Each field it uses is kept only when it has the right type and a
sensible range (anything else is dropped), so a forged or broken state can neither stop the
scheduler pass, nor store a non-finite or absurd figure, nor say more than its own job.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .. import clock

# The variable naming one start of a job (one submission, on Slurm): the runner writes it
# into its state, so a state.json left by an earlier attempt is never taken for this one's.
ATTEMPT_ID = "GPUSLICE_ATTEMPT_ID"
STATUSES = ("starting", "running", "completed", "failed", "preempted")
MAX_CELLS = 1_000_000
MAX_SECONDS = 1e9
MAX_TEXT = 2000


def _number(value: Any, lo: float, hi: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and lo <= value <= hi else None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_CELLS else None


# How far in the future a runner's checkpoint time may be (clock skew between hosts).
CHECKPOINT_SKEW = 60.0


def runner_claims(state: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The checked subset of a runner's state (same keys as the runner writes)."""
    now = clock.timestamp() if now is None else now
    out: dict[str, Any] = {}
    status = state.get("status")
    if isinstance(status, str) and status in STATUSES:
        out["status"] = status
    for key in ("attempt", "cells_done", "cells_total", "preempted_attempt"):
        if (n := _count(state.get(key))) is not None:
            out[key] = n
    error = state.get("error")
    if isinstance(error, str):
        out["error"] = _text(error[:MAX_TEXT])
    numbers = {
        "lost_work_seconds": (0.0, MAX_SECONDS),
        # a checkpoint cannot be from the future (a minute's clock skew allowed)
        "last_checkpoint_at": (0.0, now + CHECKPOINT_SKEW),
        "utilization": (0.0, 100.0),
        "memory_mib": (0.0, 1e9),
        "utilization_interval": (0.0, 1e7),
    }
    for key, (lo, hi) in numbers.items():
        if (x := _number(state.get(key), lo, hi)) is not None:
            out[key] = x
    for key in ("utilization_at", "attempt_id"):
        text = state.get(key)
        if isinstance(text, str) and len(text) <= 64:
            out[key] = _text(text)
    return out


def _text(value: str) -> str:
    """``value`` as text every database stores: JSON may spell lone surrogates
    (``"\\ud800"``), which no UTF-8 column takes, and NUL (``"\\u0000"``, or a failed
    cell's own message), which PostgreSQL's text refuses. Such a write would fail on every
    pass, and the job would hold its slice forever. Each becomes U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", value)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
