"""Snapshot and restore of a Python kernel's namespace, run inside the kernel.

What is saved: modules (as their names, re-imported on restore), functions and classes
defined in the notebook (as their source, re-executed: pickle can only refer to them by
name), and every other value pickle accepts. What cannot be saved (open files, sockets,
generators, locks, …) is listed with the reason, and the runner copies that list into the
job log. IPython's own names (``In``, ``Out``, ``_``…) and private names are skipped.
"""

from __future__ import annotations

import importlib
import inspect
import json
import time
import types
from typing import Any

from .atomic import atomic_write, write_all
from .format import decode, encode, read_records, records

_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}


def _skip(name: str) -> bool:
    return name.startswith("_") or name in _IPYTHON_NAMES


def _source(value: Any) -> str | None:
    if getattr(value, "__module__", None) != "__main__":
        return None
    if not isinstance(value, (types.FunctionType, type)):
        return None
    try:
        return inspect.getsource(value)
    except (OSError, TypeError):
        return None


def snapshot(ns: dict[str, Any], path: str) -> dict[str, Any]:
    """Write ``ns`` to ``path`` atomically; returns what was saved and what was not."""
    started = time.monotonic()
    modules: dict[str, str] = {}
    sources: dict[str, str] = {}
    items = []
    skipped: dict[str, str] = {}
    for name, value in list(ns.items()):
        if _skip(name):
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        src = _source(value)
        if src is not None:
            sources[name] = src
            continue
        if isinstance(value, (types.FunctionType, type)) and value.__module__ == "__main__":
            skipped[name] = "defined in the notebook but its source is not available"
            continue
        try:
            items.append((name, *encode(value)))
        except Exception as e:
            skipped[name] = f"{type(e).__name__}: {e}"[:300]
    meta = {"modules": modules, "sources": sources, "skipped": skipped}
    items.insert(0, ("__gpuslice_meta__", json.dumps(meta).encode(), []))
    size = atomic_write(path, lambda f: write_all(f, records(items)))
    return {
        "saved": sorted([n for n, *_ in items[1:]] + list(modules) + list(sources)),
        "skipped": skipped,
        "bytes": size,
        "seconds": round(time.monotonic() - started, 3),
    }


def restore(ns: dict[str, Any], path: str) -> dict[str, Any]:
    """Load a snapshot into ``ns``: modules, then notebook definitions, then values."""
    meta: dict[str, Any] = {"modules": {}, "sources": {}, "skipped": {}}
    values: list[tuple[str, bytes, list[bytearray]]] = []
    with open(path, "rb") as f:
        for name, data, buffers in read_records(f):
            if name == "__gpuslice_meta__":
                meta = json.loads(data)
            else:
                values.append((name, data, buffers))
    failed: dict[str, str] = {}
    for name, module in meta["modules"].items():
        try:
            ns[name] = importlib.import_module(module)
        except ImportError as e:
            failed[name] = str(e)
    for name, src in meta["sources"].items():
        try:
            exec(compile(src, f"<restored {name}>", "exec"), ns)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {e}"
    for name, data, buffers in values:
        try:
            ns[name] = decode(data, buffers)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {e}"[:300]
    return {"restored": len(values) + len(meta["modules"]) + len(meta["sources"]), "failed": failed}


def snapshot_kernel(path: str) -> str:
    """Entry point the runner executes in the kernel; prints a JSON report."""
    import __main__

    ns = _user_ns() or vars(__main__)
    return json.dumps(snapshot(ns, path))


def restore_kernel(path: str) -> str:
    import __main__

    ns = _user_ns() or vars(__main__)
    return json.dumps(restore(ns, path))


def _user_ns() -> dict[str, Any] | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return ip.user_ns if ip is not None else None
