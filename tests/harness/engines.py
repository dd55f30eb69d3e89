"""Skip locally, fail in CI: a test that needs a missing engine must not pass silently there."""

from __future__ import annotations

import os

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
