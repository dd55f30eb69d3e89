"""Request bodies: one JSON object with known fields only (shared by every REST handler).

Everything a client sends is refused here, before any handler looks at it, when it could not
be stored or served back as JSON: a body over the size limit, nesting deeper than
``MAX_DEPTH``, ``NaN``/``Infinity`` (not JSON, and poison for every figure computed from them),
strings that are not valid Unicode (lone surrogates such as ``"\\ud800"``, which no database
or JSON encoder takes), strings longer than ``MAX_STRING``, and NUL characters (PostgreSQL's
text refuses them: such a write was a 500 there) outside the fields a handler stores as files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from .errors import GPUSliceError

DEFAULT_MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32
# Longer strings only belong in notebooks (cell sources and outputs), parsed with a larger cap.
MAX_STRING = 64 * 1024


class BodyError(GPUSliceError, ValueError):
    """The body is not a JSON object of the allowed fields; the message says why.

    ``status`` is 413 for a body over the size limit, 400 otherwise."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _no_constant(name: str) -> Any:
    raise BodyError(f"request body contains {name}, which is not a JSON number")


def check_json_value(value: Any, max_string: int = MAX_STRING, max_depth: int = MAX_DEPTH) -> None:
    """Walk a decoded JSON value (without recursion): bounded depth, valid Unicode strings
    (keys included) of bounded length, finite numbers. Raises BodyError naming the first problem."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item, max_string)
        elif isinstance(item, float) and not math.isfinite(item):
            # 1e400 decodes to inf without passing through parse_constant
            raise BodyError("request body contains a number too large to represent")
        elif isinstance(item, dict | list):
            if depth > max_depth:
                raise BodyError(f"request body is nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for k, v in item.items():
                    _check_string(k, max_string)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in item)


def _check_string(s: str, max_string: int) -> None:
    if len(s) > max_string:
        raise BodyError(f"a string in the request body is longer than {max_string} characters")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError("a string in the request body is not valid Unicode") from None


def _holds_nul(value: Any) -> bool:
    """Whether a decoded JSON value (its depth already bounded) has a NUL in a string or a
    key."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json(
    raw: bytes | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_string: int = MAX_STRING,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Decode a JSON request body within the limits above."""
    raw = raw or b"{}"
    if len(raw) > max_bytes:
        raise BodyError(f"request body is larger than {max_bytes} bytes", status=413)
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError(f"request body is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BodyError(f"request body is not valid JSON: {e}") from e
    check_json_value(data, max_string, max_depth)
    return data


def parse_json_object(
    raw: bytes | None,
    allowed: Collection[str],
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_string: int = MAX_STRING,
    file_fields: Collection[str] = (),
) -> dict[str, Any]:
    """``file_fields``: fields stored as files, never in the ledger (a notebook, whose
    outputs may hold any character): the only ones that may hold a NUL."""
    data = parse_json(raw, max_bytes, max_string)
    if not isinstance(data, dict):
        raise BodyError("request body must be a JSON object")
    for key, value in data.items():
        if key not in file_fields and _holds_nul(value):
            raise BodyError(f"field {key[:100]!r} holds a NUL character (\\u0000)")
    unknown = set(data) - set(allowed)
    if unknown:
        raise BodyError(f"unknown field {sorted(unknown)[0]!r}; allowed: {sorted(allowed)}")
    return data
