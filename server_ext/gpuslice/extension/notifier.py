"""The out-of-band notifier: a callable the admin configures (e-mail, chat) that is told
about warnings and culls when the user has no JupyterLab tab open to see them."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

Notifier = Callable[[dict[str, Any]], Any]


def load_notifier(spec: Any) -> Notifier | None:
    """*spec*: a callable, ``"package.module:function"``, or empty for none."""
    if not spec:
        return None
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"notifier must be a callable or 'module:function', got {spec!r}")
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"notifier {spec!r} is not a callable")
    return fn  # type: ignore[no-any-return]


async def notify(fn: Notifier, message: dict[str, Any]) -> None:
    result = fn(message)
    if inspect.isawaitable(result):
        await result
