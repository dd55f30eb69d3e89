"""Request bodies: one JSON object with known fields only (shared by every REST handler)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any


class BodyError(ValueError):
    """The body is not a JSON object of the allowed fields; the message says why."""


def parse_json_object(raw: bytes | None, allowed: Collection[str]) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise BodyError(f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise BodyError("request body must be a JSON object")
    unknown = set(data) - set(allowed)
    if unknown:
        raise BodyError(f"unknown field {sorted(unknown)[0]!r}; allowed: {sorted(allowed)}")
    return data
