"""Parameters, papermill-style: a cell tagged ``injected-parameters`` is inserted after the
cell tagged ``parameters`` (or first, when there is none), overriding its defaults."""

from __future__ import annotations

import ast
import json
import keyword
import re
from typing import Any

import nbformat

from ..errors import GPUSliceError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
# Parameters are settings, not data: the injected cell stays readable and the row small.
MAX_PARAMETERS = 100
MAX_PARAMETERS_BYTES = 64 * 1024
PARAM_TYPES = (str, int, float, bool, type(None))
# papermill's tag of the cell that sets the parameters
INJECTED_TAG = "injected-parameters"


class ParameterError(GPUSliceError, ValueError):
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
        if keyword.iskeyword(name):
            # (``import = 3`` would fail the job in its first cell, the injected one)
            raise ParameterError(f"parameter name {name!r} is a Python keyword")
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


def injection_point(nb: nbformat.NotebookNode) -> int:
    """Where the injected cell goes: after the cell tagged ``parameters``, else first."""
    for i, c in enumerate(nb.cells):
        if "parameters" in c.get("metadata", {}).get("tags", []):
            return i + 1
    return 0


def is_injected(cell: nbformat.NotebookNode) -> bool:
    """Whether ``cell`` is the one :func:`inject` inserted."""
    return INJECTED_TAG in cell.get("metadata", {}).get("tags", [])


def inject(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> None:
    """Insert the injected-parameters cell (Python kernels only: values as Python literals)."""
    if not parameters:
        return
    lines = ["# Parameters injected by gpuslice"]
    lines += [f"{name} = {value!r}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = [INJECTED_TAG]
    nb.cells.insert(injection_point(nb), cell)


def parameter_warnings(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> list[str]:
    """What a researcher must know before trusting the result: the notebook has no cell
    tagged ``parameters`` (the values go first, papermill's rule), or a later cell assigns
    a parameter again, so the value given is overwritten and the job computes with another.
    Cells that are not plain Python (magics, other languages) are not looked into."""
    if not parameters:
        return []
    at = injection_point(nb)
    warnings = []
    code = [(i, c) for i, c in enumerate(nb.cells) if c.get("cell_type") == "code"]
    for number, (index, cell) in enumerate(code, start=1):
        if index < at:
            continue
        source = cell.get("source", "")
        # nbformat JSON may hold a cell's source as a list of lines
        text = "".join(source) if isinstance(source, list) else str(source)
        for name, line in _assigned(text):
            if name in parameters:
                warnings.append(
                    f"parameter {name} is set again in code cell {number} (line {line}): "
                    f"your value {parameters[name]!r} is overwritten"
                )
    # the overwrites first: they change the result (short: JupyterLab shows the first)
    if at == 0:
        warnings.append("no cell is tagged 'parameters': the values are set before the first cell")
    return warnings


def _module_scope(tree: ast.AST) -> list[ast.AST]:
    """Every node that runs in the notebook's namespace: not inside a function, class,
    lambda or comprehension (their names are their own)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if node is not tree and isinstance(
            node,
            ast.FunctionDef
            | ast.AsyncFunctionDef
            | ast.ClassDef
            | ast.Lambda
            | ast.ListComp
            | ast.SetComp
            | ast.DictComp
            | ast.GeneratorExp,
        ):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _assigned(source: str) -> list[tuple[str, int]]:
    """Top-level names a cell binds (assignments, for loops, imports, defs), with lines."""
    lines = [ln if not ln.lstrip().startswith(("%", "!")) else "" for ln in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    out = []
    for node in _module_scope(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.NamedExpr):
            targets = [node.target]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.name, node.lineno))
            continue
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out += [((a.asname or a.name).split(".")[0], node.lineno) for a in node.names]
            continue
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name) and isinstance(leaf.ctx, ast.Store):
                    out.append((leaf.id, leaf.lineno))
    return sorted(set(out), key=lambda x: (x[1], x[0]))
