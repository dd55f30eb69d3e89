"""What a logger said, captured on the logger itself.

pytest's ``caplog`` listens on the root logger. Once any test of a worker has made a traitlets
``Application`` (a JupyterHub, a jupyter-server), ``LoggingConfigurable.log`` is that
application's logger, which does not propagate to the root: a test that read the spawner's
or the hub's warnings through ``caplog`` saw nothing, depending on which tests ran before it
on the same worker. A handler added to that logger is no better: the application's first use
of its ``log`` removes every handler of it, and its ``dictConfig`` disables loggers made
before it. A filter stays, and sees each record the logger itself handles."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def said_by(logger: logging.Logger | str, level: int = logging.WARNING) -> Iterator[list[str]]:
    """The messages ``logger`` itself handles at ``level`` or above while the block runs."""
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    messages: list[str] = []

    def collect(record: logging.LogRecord) -> bool:
        if record.levelno >= level:
            messages.append(record.getMessage())
        return True  # (a filter: the record goes on as before)

    # (an application's logging.config.dictConfig disables the loggers that existed before
    # it, and may set a level above ``level``: undone for the block)
    disabled, before = target.disabled, target.level
    target.disabled = False
    if not target.isEnabledFor(level):
        target.setLevel(level)
    target.addFilter(collect)
    try:
        yield messages
    finally:
        target.removeFilter(collect)
        target.disabled = disabled
        target.setLevel(before)
