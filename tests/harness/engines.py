"""Skip locally, fail in CI: a test that needs a missing engine must not pass silently there."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def need(ok: bool, what: str) -> None:
    """Stop the current test when ``what`` is missing: skip on a laptop, fail in CI."""
    if ok:
        return
    message = f"{what} is not available"
    if IN_CI:
        pytest.fail(message + " (CI=true: every engine must be installed by .ci/run)")
    pytest.skip(message)


def need_module(name: str) -> ModuleType:
    """Import ``name`` for a test; like ``pytest.importorskip``, but failing in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        need(False, f"the Python package {name} (pip install -e '.[test]')")
        raise  # unreachable: need() skipped or failed the test
