"""Time arithmetic inside the database, for the SQLite and PostgreSQL the ledger runs on.

Reading tens of thousands of timestamps into Python costs far more than the arithmetic on
them (SQLite's are strings to parse), so the long-range views compute in SQL instead.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, Integer
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class epoch(FunctionElement[float]):
    """Seconds since 1970 of a timestamp column (UTC)."""

    type = Float()
    inherit_cache = True


class floor_div(FunctionElement[int]):
    """``floor(a / b)`` for a >= 0 (the index of the bucket of width b that a falls into)."""

    type = Integer()
    inherit_cache = True


@compiles(epoch, "sqlite")
def _epoch_sqlite(element: epoch, compiler: Any, **kw: Any) -> str:
    # the ledger stores UTC wall time as text; julianday() reads it, 2440587.5 is 1970-01-01
    return f"((julianday({compiler.process(element.clauses, **kw)}) - 2440587.5) * 86400.0)"


@compiles(epoch)
def _epoch_default(element: epoch, compiler: Any, **kw: Any) -> str:
    return f"EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})"


@compiles(floor_div, "sqlite")
def _floor_div_sqlite(element: floor_div, compiler: Any, **kw: Any) -> str:
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    # CAST truncates toward zero, which is floor for the non-negative offsets used here
    return f"CAST(({a}) / ({b}) AS INTEGER)"


@compiles(floor_div)
def _floor_div_default(element: floor_div, compiler: Any, **kw: Any) -> str:
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    return f"CAST(FLOOR(({a}) / ({b})) AS INTEGER)"
