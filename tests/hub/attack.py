"""Helpers for tests/hub/test_attack_matrix.py: strict JSON, hostile request bodies built from
the OpenAPI schemas, and a check that a response carries no other user's data."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

# -- responses ---------------------------------------------------------------------------


class NotStrictJSON(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise NotStrictJSON(f"{name} in a response body")


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON that every client can parse: no NaN, Infinity, or number so large it
    decodes to infinity."""
    data = json.loads(raw, parse_constant=_refuse_constant)
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise NotStrictJSON("a number too large to represent in a response body")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return data


def error_problems(status: int, content: bytes) -> list[str]:
    """What is wrong with an API error response: it must be strict JSON with a message."""
    try:
        body = strict_json(content)
    except (ValueError, UnicodeDecodeError) as e:
        return [f"{status} with a body that is not strict JSON ({e}): {content[:200]!r}"]
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return [f"{status} without a 'message': {content[:200]!r}"]
    return []


def leaks(data: Any, users: set[str], alloc_ids: set[int], job_ids: set[int]) -> Iterator[str]:
    """Every place in a decoded JSON response that names one of ``users`` or refers to one of
    their allocations or jobs."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key in ("user", "owner") and value in users:
                yield f"{key}={value!r}"
            elif key == "allocation_id" and value in alloc_ids:
                yield f"allocation_id={value}"
            elif key == "allocation_ids" and isinstance(value, list) and alloc_ids & set(value):
                yield f"allocation_ids={value}"
            elif key == "job_id" and value in job_ids:
                yield f"job_id={value}"
            stack.append(value)


def names_in_text(text: str, users: set[str]) -> list[str]:
    return [u for u in sorted(users) if re.search(rf"(?<![\w-]){re.escape(u)}(?![\w-])", text)]


# -- request bodies from the spec --------------------------------------------------------


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``$ref`` followed and ``allOf`` parts merged (properties, required)."""
    while "$ref" in schema:
        node: Any = spec
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    if "allOf" not in schema:
        return schema
    merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    for part in schema["allOf"]:
        part = resolve(spec, part)
        merged["properties"].update(part.get("properties", {}))
        merged["required"] += part.get("required", [])
    return merged


def body_schema(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any] | None:
    body = operation.get("requestBody")
    if body is None:
        return None
    return resolve(spec, resolve(spec, body)["content"]["application/json"]["schema"])


def fields(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, tuple[dict, bool]]:
    """Every documented field of an object schema, nested ones dotted (``detail.scope``):
    name -> (its schema, whether it is required)."""
    out: dict[str, tuple[dict, bool]] = {}
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        prop = resolve(spec, prop)
        out[name] = (prop, name in required)
        if prop.get("type") == "object":
            for sub, (sub_schema, sub_required) in fields(spec, prop).items():
                out[f"{name}.{sub}"] = (sub_schema, sub_required)
    return out


# One value of each JSON type (and the falsy ones, which ``x or default`` code lets through).
SAMPLES: list[tuple[str, Any]] = [
    ("a string", "x"),
    ("an integer", 7),
    ("zero", 0),
    ("a fraction", 1.5),
    ("true", True),
    ("false", False),
    ("an array", ["x"]),
    ("an empty array", []),
    ("an object", {"x": 1}),
    ("an empty object", {}),
]


def fits(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def wrong_types(schema: dict[str, Any], required: bool) -> list[tuple[str, Any]]:
    """Values of another JSON type than the field's (null too, when it is required and not
    nullable). Values of the right type that an enum refuses are not wrong *types*."""
    out = []
    for label, value in SAMPLES:
        right_type = fits(value, {"type": schema.get("type")})
        if not right_type:
            out.append((label, value))
    if required and not schema.get("nullable"):
        out.append(("null", None))
    return out


def patched(base: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """A copy of ``base`` with ``field`` (dotted for a nested one: ``detail.idle_seconds``)
    set to ``value``."""
    out = json.loads(json.dumps(base))
    *parents, last = field.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def with_raw(base: dict[str, Any], field: str, literal: bytes) -> bytes:
    """``base`` as JSON with ``field``'s value replaced by the raw bytes ``literal``."""
    marker = "@@raw-value@@"
    text = json.dumps(patched(base, field, marker)).encode()
    return text.replace(json.dumps(marker).encode(), literal)


def big_body(size: int) -> bytes:
    return b'{"reason": "' + b"a" * size + b'"}'


def deep_array(depth: int) -> bytes:
    return b'{"reason": ' + b"[" * depth + b"]" * depth + b"}"


def many_keys(n: int) -> bytes:
    return b"{" + b",".join(b'"k%d":0' % i for i in range(n)) + b"}"
