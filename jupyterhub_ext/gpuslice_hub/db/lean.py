"""The ledger's most frequent statements, run on SQLite's own cursor.

SQLAlchemy's execution of a statement already compiled and cached (an execution context,
parameter processing, a result object with its rows) costs about ten times what SQLite
spends on the short statements the scheduler's pass and the allocation path run
thousands of times an hour (docs/benchmarks.md). ``Lean`` compiles a Core statement once
per dialect with SQLAlchemy and keeps what its execution would do: the SQL (for an
``IN`` list, one per list length), the order of its parameters, the type processing of
each parameter and of each column of the result. On SQLite it then runs the statement on
the driver's cursor, in the connection's transaction, and raises SQLAlchemy's exceptions;
on any other database, and for a call that needs more than that (an UPDATE's Python-side
column default, a default that reads its execution context, an empty ``IN`` list), it is
an ordinary ``conn.execute``.

With ``GPUSLICE_LEAN_CHECK=1`` in its environment a process checks every lean execution
against SQLAlchemy's own: the same SQL and parameters sent to the driver, the same rows
back. The test suite runs so (tests/conftest.py; the test hub sets it for the service).
"""

from __future__ import annotations

import collections
import os
import sqlite3
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Executable, Select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, NoResultFound

CHECK_ENV = "GPUSLICE_LEAN_CHECK"

_Processor = Callable[[Any], Any] | None


class _Plan:
    __slots__ = (
        "_converted",
        "_sqls",
        "_template",
        "binds",
        "calls",
        "columns",
        "compiled",
        "defaults",
        "expanding",
        "keys",
        "names",
        "row",
        "sql",
    )

    def __init__(self, stmt: Any, dialect: Dialect, keys: tuple[str, ...], named: bool) -> None:
        # as SQLAlchemy compiles it for a call naming ``keys`` (an INSERT without values
        # inserts the columns named, an UPDATE sets them too)
        compiled = self.compiled = stmt.compile(dialect=dialect, column_keys=list(keys))
        if compiled.update_prefetch:
            raise _NotLean("Python-side column defaults of an UPDATE")
        if not dialect.positional or compiled.positiontup is None:
            raise _NotLean("named parameters")
        self.sql: str = compiled.string
        self.names: tuple[str, ...] = tuple(compiled.positiontup)
        # the statement's own values (``state == "queued"``), what a call does not name
        self.defaults: dict[str, Any] = compiled.construct_params(_check=False)
        # an INSERT's Python-side defaults of the columns a call does not name: a constant
        # is one more of the statement's own values; a function of nothing (``list``) is
        # called for each execution, as SQLAlchemy does
        self.calls: tuple[tuple[str, Callable[[], Any]], ...] = ()
        for column in compiled.insert_prefetch:
            key = compiled._within_exec_param_key_getter(column)
            default = column.default
            if default is not None and default.is_scalar:
                self.defaults[key] = default.arg
            elif default is not None and default.is_callable and default.arg is not default._fn:
                # (SQLAlchemy wraps a function that takes no context, and only that one)
                self.calls += ((key, default._fn),)
            else:
                raise _NotLean(f"a column default lean cannot compute: {column}")
        processors = compiled._bind_processors
        # (an expanding parameter's processor is its elements')
        self.binds: tuple[_Processor, ...] = tuple(processors.get(n) for n in self.names)
        # (index, processor) of the parameters that have one
        self._converted: tuple[tuple[int, Callable[[Any], Any]], ...] = tuple(
            (i, p) for i, p in enumerate(self.binds) if p is not None
        )
        # ``IN`` lists: one placeholder per element, the SQL made once per list length
        self.expanding = frozenset(n for n in self.names if compiled.binds[n].expanding)
        if self.calls and self.expanding:
            raise _NotLean("column defaults with an IN list")
        self._template = self.sql
        self._sqls: dict[tuple[int, ...], str] = {}
        self.columns: tuple[tuple[int, Callable[[Any], Any]], ...] | None = None
        self.row: Any = None
        self.keys = tuple(c.keyname for c in compiled._result_columns)
        if compiled._result_columns:
            procs = tuple(
                c.type._cached_result_processor(dialect, None) for c in compiled._result_columns
            )
            # (index, processor) of the columns that have one: most have none
            self.columns = tuple((i, p) for i, p in enumerate(procs) if p is not None)
            if named:
                fields = [c.keyname for c in compiled._result_columns]
                self.row = collections.namedtuple("Row", fields, rename=True)  # type: ignore[misc]
                if list(self.row._fields) != fields:
                    raise _NotLean(f"columns without a name to read them by: {fields}")

    def render(self, params: Mapping[str, Any] | None) -> tuple[str, tuple[Any, ...]] | None:
        """The SQL and its arguments for a call with ``params``; None where SQLAlchemy
        renders it otherwise (an empty ``IN`` list)."""
        values = self.defaults if not params else {**self.defaults, **params}
        if self.calls:
            values = {**values, **{key: call() for key, call in self.calls}}
        if not self.expanding:
            plain = [values[n] for n in self.names]
            for i, convert in self._converted:
                v = plain[i]
                if v is not None:
                    plain[i] = convert(v)
            return self.sql, tuple(plain)
        args: list[Any] = []
        lengths = []
        for name, p in zip(self.names, self.binds, strict=True):
            v = values[name]
            if name in self.expanding:
                if not v:
                    return None
                lengths.append(len(v))
                args.extend(v if p is None else [x if x is None else p(x) for x in v])
            else:
                args.append(v if p is None or v is None else p(v))
        return self._expanded(tuple(lengths)), tuple(args)

    def _expanded(self, lengths: tuple[int, ...]) -> str:
        sql = self._sqls.get(lengths)
        if sql is None:
            sql = self._template
            names = [n for n in self.names if n in self.expanding]
            for name, n in zip(names, lengths, strict=True):
                sql = sql.replace(f"__[POSTCOMPILE_{name}]", ", ".join("?" * n), 1)
            if len(self._sqls) > 256:  # (a bound: chunks of any length up to the caller's)
                self._sqls.clear()
            self._sqls[lengths] = sql
        return sql


class _NotLean(Exception):
    pass


_Plans = dict[frozenset[str], _Plan | None]


class LeanResult:
    """What the callers of a lean statement read of its result."""

    __slots__ = ("_keys", "rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int, keys: tuple[str, ...] = ()) -> None:
        self.rows, self.rowcount, self._keys = rows, rowcount, keys

    def keys(self) -> tuple[str, ...]:
        """The names of the result's columns, in order."""
        return self._keys

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def first(self) -> Any:
        return self.rows[0] if self.rows else None

    def one(self) -> Any:
        if len(self.rows) != 1:
            raise NoResultFound(f"expected one row, got {len(self.rows)}")
        return self.rows[0]

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None

    def scalar_one(self) -> Any:
        if len(self.rows) != 1:
            raise NoResultFound(f"expected one row, got {len(self.rows)}")
        return self.rows[0][0]

    def scalars(self) -> list[Any]:
        return [r[0] for r in self.rows]


class Lean:
    """``stmt``, to be run with :meth:`execute` (a Core statement built once).
    ``named``: its rows are read by column name (``row.id``), not only by position."""

    __slots__ = ("_by_dialect", "_last", "named", "stmt")

    def __init__(self, stmt: Executable, named: bool = False) -> None:
        self.stmt, self.named = stmt, named
        # per dialect (each engine has its own: the ledger's reads and writes alternate
        # between two), per set of parameter names a call gives: None where not lean
        self._by_dialect: weakref.WeakKeyDictionary[Dialect, _Plans] = weakref.WeakKeyDictionary()
        # the last dialect's, as one value: threads read it without a lock
        self._last: tuple[Dialect | None, _Plans] = (None, {})

    @property
    def _plans(self) -> _Plans:
        """(tests) The plans of the last dialect used."""
        return self._last[1]

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> LeanResult:
        dialect = conn.dialect
        last, plans = self._last
        if dialect is not last:
            plans = self._by_dialect.setdefault(dialect, {})
            self._last = (dialect, plans)
        keys = frozenset(params) if params else frozenset()
        try:
            plan = plans[keys]
        except KeyError:
            plan = plans[keys] = self._plan(dialect, keys)
        rendered = None if plan is None else plan.render(params)
        if plan is None or rendered is None:
            return _through_sqlalchemy(conn, self.stmt, params)
        sql, args = rendered
        if _CHECK:
            _check(conn, self.stmt, params, plan, sql, args)
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql, args)
            rows = cursor.fetchall() if plan.columns is not None else []
            rowcount = cursor.rowcount
        except sqlite3.Error as e:
            # SQLAlchemy's errors, as its own execution raises them (IntegrityError, ...)
            raise DBAPIError.instance(sql, args, e, sqlite3.Error) from e
        finally:
            cursor.close()
        if plan.columns:
            rows = [_processed(row, plan.columns) for row in rows]
        if plan.row is not None:
            make = plan.row._make
            rows = [make(row) for row in rows]
        if _CHECK and isinstance(self.stmt, Select):
            expected = _through_sqlalchemy(conn, self.stmt, params).rows
            if rows != expected:
                raise AssertionError(f"lean rows differ from SQLAlchemy's: {rows} != {expected}")
        return LeanResult(rows, rowcount, plan.keys)

    def _plan(self, dialect: Dialect, keys: frozenset[str]) -> _Plan | None:
        if dialect.name != "sqlite":
            return None
        try:
            return _Plan(self.stmt, dialect, tuple(sorted(keys)), self.named)
        except _NotLean:
            return None


def _processed(
    row: Sequence[Any], procs: tuple[tuple[int, Callable[[Any], Any]], ...]
) -> tuple[Any, ...]:
    values = list(row)
    for i, p in procs:
        v = values[i]
        if v is not None:
            values[i] = p(v)
    return tuple(values)


def _through_sqlalchemy(
    conn: Connection, stmt: Executable, params: Mapping[str, Any] | None
) -> LeanResult:
    result = conn.execute(stmt, dict(params) if params else None)
    # (SQLAlchemy's rows: tuples that are also read by column name)
    if not result.returns_rows:
        return LeanResult([], result.rowcount)
    return LeanResult(list(result), result.rowcount, tuple(result.keys()))


_CHECK = os.environ.get(CHECK_ENV) == "1"


def _check(
    conn: Connection,
    stmt: Any,
    params: Mapping[str, Any] | None,
    plan: _Plan,
    sql: str,
    args: tuple[Any, ...],
) -> None:
    """What SQLAlchemy would send the driver for ``stmt`` is what the plan sends (its
    execution context, built without executing anything)."""
    ctx = conn.dialect.execution_ctx_cls._init_compiled(  # type: ignore[attr-defined]
        conn.dialect,
        conn,
        conn.connection,
        conn._execution_options,
        plan.compiled,
        [dict(params) if params else {}],
        stmt,
        None,
    )
    sent = (ctx.statement, tuple(ctx.parameters[0]))
    if plan.calls:
        # a default's function was called for each (``utcnow``: another instant); the
        # check is that the same function gave the value sent in the same place
        called = {key for key, _ in plan.calls}
        computed = [i for i, name in enumerate(plan.names) if name in called]
        for i in computed:  # (before the values are set aside: compared by type only)
            if type(args[i]) is not type(sent[1][i]):
                raise AssertionError(f"lean default {plan.names[i]} differs: {args[i]!r}")
        args = tuple(sent[1][i] if i in computed else a for i, a in enumerate(args))
    if sent != (sql, args):
        lean = (sql, args)
        raise AssertionError(f"lean execution differs from SQLAlchemy's: {lean} != {sent}")
