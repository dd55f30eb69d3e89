"""The idle-reclaim event schema, registered with the server's event logger so that
``/api/events/subscribe`` clients (the JupyterLab extension) receive it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..isotime import iso
from .decisions import Decision

SCHEMA_ID = "https://events.gpuslice.dev/idle/v1"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schemas" / "idle-v1.yaml"


def event_data(decision: Decision) -> dict[str, Any]:
    return {
        "action": decision.action,
        "kernel_id": decision.kernel_id,
        "deadline": iso(decision.deadline),
        "reason": decision.reason,
        "idle_seconds": float(decision.idle_seconds),
    }


def register(event_logger: Any) -> None:
    if SCHEMA_ID not in getattr(event_logger.schemas, "schema_ids", ()):
        event_logger.register_event_schema(SCHEMA_PATH)


def emit(event_logger: Any, decision: Decision) -> None:
    event_logger.emit(schema_id=SCHEMA_ID, data=event_data(decision))
