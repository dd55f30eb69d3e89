"""What the idle and memory-cap rules decide; the monitor carries the decisions out."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocab import IDLE_EVENT_KINDS

# The ``action`` values of the idle event schema (schemas/idle-v1.yaml).
WARNING = "warning"
EXTENDED = "extended"
CULLED = "culled"
MEMORY_WARNING = "memory-warning"
MEMORY_CULLED = "memory-culled"
# Not a decision of the rules: the person gave the slice back ("Save and release GPU", in
# one of the server's tabs); told to every tab, so that the others stop warning too.
RELEASED = "released"

# The service's event kind for each decision.
SERVICE_KIND = IDLE_EVENT_KINDS


@dataclass(frozen=True)
class Decision:
    action: str
    kernel_id: str | None  # None: the whole server
    deadline: float | None  # epoch seconds
    reason: str
    idle_seconds: float = 0.0
    memory_bytes: int | None = None
