"""Parameters, papermill-style: a cell tagged ``injected-parameters`` is inserted after the
cell tagged ``parameters`` (or first, when there is none), overriding its defaults."""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
# Parameters are settings, not data: the injected cell stays readable and the row small.
MAX_PARAMETERS = 100
MAX_PARAMETERS_BYTES = 64 * 1024
PARAM_TYPES = (str, int, float, bool, type(None))


class ParameterError(ValueError):
    pass


def validate(parameters: Any) -> dict[str, Any]:
    """Names must be identifiers, values JSON scalars or lists/dicts of them."""
    if not isinstance(parameters, dict):
        raise ParameterError("parameters must be a JSON object of name: value")
    if len(parameters) > MAX_PARAMETERS:
        raise ParameterError(f"at most {MAX_PARAMETERS} parameters")
    try:
        size = len(json.dumps(parameters, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ParameterError(f"parameters must be JSON values: {e}") from None
    if size > MAX_PARAMETERS_BYTES:
        raise ParameterError(f"parameters are larger than {MAX_PARAMETERS_BYTES} bytes in all")
    for name, value in parameters.items():
        if not isinstance(name, str) or not _IDENT.match(name) or name.startswith("__"):
            raise ParameterError(f"parameter name {name!r} is not a Python identifier")
        _check_value(name, value, 0)
    return parameters


def _check_value(name: str, value: Any, depth: int) -> None:
    if depth > 4:
        raise ParameterError(f"parameter {name} is nested too deeply")
    if isinstance(value, PARAM_TYPES):
        return
    if isinstance(value, list):
        for v in value:
            _check_value(name, v, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ParameterError(f"parameter {name}: dict keys must be strings")
            _check_value(name, v, depth + 1)
        return
    raise ParameterError(f"parameter {name} has an unsupported type {type(value).__name__}")


def inject(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> None:
    """Insert the injected-parameters cell (Python kernels only: values as Python literals)."""
    if not parameters:
        return
    lines = ["# Parameters injected by gpuslice"]
    lines += [f"{name} = {value!r}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["injected-parameters"]
    at = 0
    for i, c in enumerate(nb.cells):
        if "parameters" in c.get("metadata", {}).get("tags", []):
            at = i + 1
            break
    nb.cells.insert(at, cell)
